//go:build linux

package jupyter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"kernelgate/internal/tailbuf"
	"kernelgate/kernelspecs"
)

// execProvisioner starts a kernelspec's argv as a child process, in a
// process group of its own, with its connection file in a directory of
// the test: the least a provisioner does, so that the kernel client is
// tested against real kernels without the gateway's provisioners (which
// live in provision/ and import this package).
type execProvisioner struct{ dir string }

func testProvisioner(t testing.TB) *execProvisioner { return &execProvisioner{dir: t.TempDir()} }

var (
	_ Provisioner  = (*execProvisioner)(nil)
	_ StartRetrier = (*execProvisioner)(nil)
)

func (p *execProvisioner) Capabilities(*kernelspecs.Spec) Capabilities {
	return Capabilities{SignalInterrupts: true}
}

// RetryStart: a port taken between its choice and the kernel's bind.
func (p *execProvisioner) RetryStart(_ *kernelspecs.Spec, err error, attempt int) bool {
	var died *DiedError
	return attempt < 3 && errors.As(err, &died) && strings.Contains(died.Output+died.Lost, "Address already in use")
}

func (p *execProvisioner) Launch(ctx context.Context, req LaunchRequest) (Process, error) {
	if req.Spec == nil {
		return nil, fmt.Errorf("%w: no kernelspec", ErrStartFailed)
	}
	ci := ConnInfo{IP: "127.0.0.1", Key: NewKey(), Transport: "tcp", SignatureScheme: "hmac-sha256", KernelName: req.Spec.Name}
	var ports [5]int
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	ci.ShellPort, ci.IOPubPort, ci.StdinPort, ci.ControlPort, ci.HBPort = ports[0], ports[1], ports[2], ports[3], ports[4]
	dir, err := os.MkdirTemp(p.dir, "kernel-")
	if err != nil {
		return nil, err
	}
	file := filepath.Join(dir, "connection.json")
	if err := ci.WriteFile(file); err != nil {
		return nil, err
	}
	argv, env := req.Spec.Command(file, os.LookupEnv)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "HOME="+dir)
	for _, m := range []map[string]string{env, req.Env, req.DirEnv} {
		for k, v := range m {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.Dir = dir
	if req.Cwd != "" && !req.StartFresh {
		cmd.Dir = req.Cwd
	}
	ep := &execProcess{ci: ci, cmd: cmd, dir: dir, tail: tailbuf.New(8 << 10), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = ep.tail, ep.tail
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%w: %v", ErrStartFailed, err)
	}
	go ep.wait()
	return ep, nil
}

// execProcess is a kernel execProvisioner started.
type execProcess struct {
	ci     ConnInfo
	cmd    *exec.Cmd
	dir    string
	tail   *tailbuf.Buffer
	done   chan struct{}
	status string // set before done is closed
}

var _ LocalProcess = (*execProcess)(nil)

func (ep *execProcess) wait() {
	err := ep.cmd.Wait()
	ep.status = "exit status 0"
	if err != nil {
		ep.status = err.Error()
	}
	syscall.Kill(-ep.cmd.Process.Pid, syscall.SIGKILL)
	close(ep.done)
}

func (ep *execProcess) signal(sig syscall.Signal) error {
	select {
	case <-ep.done:
		return os.ErrProcessDone
	default:
	}
	return syscall.Kill(-ep.cmd.Process.Pid, sig)
}

func (ep *execProcess) ConnInfo() ConnInfo    { return ep.ci }
func (ep *execProcess) PID() int              { return ep.cmd.Process.Pid }
func (ep *execProcess) Interrupt() error      { return ep.signal(syscall.SIGINT) }
func (ep *execProcess) Terminate() error      { return ep.signal(syscall.SIGTERM) }
func (ep *execProcess) Kill() error           { return ep.signal(syscall.SIGKILL) }
func (ep *execProcess) Done() <-chan struct{} { return ep.done }
func (ep *execProcess) ExitReason() string    { return "" }
func (ep *execProcess) Output() string        { return ep.tail.String() }
func (ep *execProcess) Cleanup() error        { return os.RemoveAll(ep.dir) }

func (ep *execProcess) ExitStatus() string {
	select {
	case <-ep.done:
		return ep.status
	default:
		return ""
	}
}

package jupyter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// LocalProvisioner runs kernels as child processes of the gateway, each in
// its own process group, with its connection file in a private directory.
type LocalProvisioner struct {
	// RuntimeDir holds one private directory per kernel; empty means
	// $TMPDIR/kernelgate-<uid>.
	RuntimeDir string
	// Transport is "tcp" (default) or "ipc".
	Transport string
	// IP the kernel binds for tcp; default 127.0.0.1.
	IP string
	// BaseEnv is the environment every kernel starts from, as KEY=VALUE;
	// nil means the gateway's own environment without KERNELGATE_* names.
	BaseEnv []string
	// OutputTail is how many bytes of the kernel's output are kept;
	// default 8 KiB.
	OutputTail int
}

var _ Provisioner = (*LocalProvisioner)(nil)

func (p *LocalProvisioner) runtimeDir() (string, error) {
	dir := p.RuntimeDir
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "kernelgate-"+strconv.Itoa(os.Getuid()))
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return dir, nil
}

// baseEnv returns the starting environment as a map.
func (p *LocalProvisioner) baseEnv() map[string]string {
	src := p.BaseEnv
	if src == nil {
		src = os.Environ()
	}
	env := make(map[string]string, len(src))
	for _, kv := range src {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || (p.BaseEnv == nil && strings.HasPrefix(k, "KERNELGATE_")) {
			continue
		}
		env[k] = v
	}
	return env
}

// Launch writes a connection file and starts the spec's argv.
func (p *LocalProvisioner) Launch(ctx context.Context, req LaunchRequest) (Process, error) {
	if req.Spec == nil || len(req.Spec.Argv) == 0 {
		return nil, fmt.Errorf("%w: no kernelspec argv", ErrStartFailed)
	}
	root, err := p.runtimeDir()
	if err != nil {
		return nil, fmt.Errorf("%w: runtime dir: %v", ErrStartFailed, err)
	}
	dir, err := os.MkdirTemp(root, "kernel-")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrStartFailed, err)
	}
	lp := &localProcess{dir: dir, done: make(chan struct{}), tail: newTailBuffer(p.OutputTail)}
	fail := func(err error) (Process, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	transport, ip := p.Transport, p.IP
	if transport == "" {
		transport = "tcp"
	}
	if transport == "ipc" {
		ip = filepath.Join(dir, "k")
	} else if ip == "" {
		ip = "127.0.0.1"
	}
	if lp.ci, err = NewConnInfo(transport, ip, req.Spec.Name); err != nil {
		return fail(fmt.Errorf("%w: %v", ErrStartFailed, err))
	}
	connFile := filepath.Join(dir, "kernel-"+req.KernelID+".json")
	if err := lp.ci.WriteFile(connFile); err != nil {
		return fail(fmt.Errorf("%w: connection file: %v", ErrStartFailed, err))
	}

	env := p.baseEnv()
	argv, specEnv := req.Spec.Command(connFile, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	for k, v := range specEnv {
		env[k] = v
	}
	for k, v := range req.Env {
		env[k] = v
	}
	// ipykernel exits when this process goes away.
	env["JPY_PARENT_PID"] = strconv.Itoa(os.Getpid())

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = envList(env)
	cmd.Dir = req.Cwd
	cmd.Stdout, cmd.Stderr = lp.tail, lp.tail
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// A kernel's children may hold its output pipes open after it exits.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("%w: %v", ErrStartFailed, err))
	}
	lp.cmd = cmd
	go lp.wait()
	return lp, nil
}

func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// localProcess is a kernel running as a child process.
type localProcess struct {
	ci   ConnInfo
	dir  string
	cmd  *exec.Cmd
	tail *tailBuffer

	done   chan struct{}
	status string // set before done is closed
}

func (lp *localProcess) ConnInfo() ConnInfo    { return lp.ci }
func (lp *localProcess) PID() int              { return lp.cmd.Process.Pid }
func (lp *localProcess) Done() <-chan struct{} { return lp.done }
func (lp *localProcess) Output() string        { return lp.tail.String() }

func (lp *localProcess) ExitStatus() string {
	select {
	case <-lp.done:
		return lp.status
	default:
		return ""
	}
}

// wait is the one goroutine that owns cmd.Wait.
func (lp *localProcess) wait() {
	err := lp.cmd.Wait()
	switch {
	case err == nil:
		lp.status = "exit status 0"
	case errors.Is(err, exec.ErrWaitDelay):
		lp.status = lp.cmd.ProcessState.String()
	default:
		lp.status = err.Error()
	}
	// Whatever the kernel left in its group goes with it.
	syscall.Kill(-lp.cmd.Process.Pid, syscall.SIGKILL)
	close(lp.done)
}

// Signal signals the kernel's process group.
func (lp *localProcess) Signal(sig syscall.Signal) error {
	select {
	case <-lp.done:
		return os.ErrProcessDone
	default:
	}
	return syscall.Kill(-lp.cmd.Process.Pid, sig)
}

func (lp *localProcess) Cleanup() error { return os.RemoveAll(lp.dir) }

// tailBuffer keeps the last n bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	n   int
	buf []byte
}

func newTailBuffer(n int) *tailBuffer {
	if n <= 0 {
		n = 8 << 10
	}
	return &tailBuffer{n: n}
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(p) >= t.n {
		t.buf = append(t.buf[:0], p[len(p)-t.n:]...)
		return len(p), nil
	}
	if over := len(t.buf) + len(p) - t.n; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

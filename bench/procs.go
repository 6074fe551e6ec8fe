//go:build linux

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/procfs"

	"kernelgate/internal/tailbuf"
)

// server is a gateway process the harness started: kernelgate or Jupyter
// Server. Its CPU time and memory are read from /proc.
type server struct {
	name  string
	url   string // http://127.0.0.1:port/
	token string
	cmd   *exec.Cmd
	dir   string // private scratch directory, removed by stop
	log   *tailbuf.Buffer
	http  *http.Client

	env []string // added to the environment of cmd

	waited chan struct{}
	once   sync.Once
}

// startKernelgate starts the kernelgate program bin with the harness's
// flags plus extra, and returns once it prints that it serves.
func startKernelgate(ctx context.Context, name, bin string, extra ...string) (*server, error) {
	dir, err := os.MkdirTemp("", "kgbench-")
	if err != nil {
		return nil, err
	}
	s := &server{name: name, token: "bench-" + strconv.Itoa(os.Getpid()), dir: dir, log: tailbuf.New(8 << 10)}
	args := []string{"serve", "--port", "0", "--kernelspec-dir", specDir, "--log-level", "warn",
		"--metrics-open", "--token", s.token, "--runtime-dir", filepath.Join(dir, "runtime")}
	// State is kept, as by default, in the scratch directory (flags in
	// extra choose otherwise: the last one counts).
	// With --state-url the records go to the database, and the state
	// directory (the default, here in the scratch directory) holds the
	// workspaces.
	// Its gateway is a replica, which needs a cluster secret.
	if slices.Contains(extra, "--state-url") {
		s.env = append(s.env, "XDG_STATE_HOME="+filepath.Join(dir, "xdg"), "KERNELGATE_CLUSTER_SECRET=bench-cluster-secret-of-at-least-32-bytes")
	} else {
		args = append(args, "--state-dir", filepath.Join(dir, "state"))
	}
	args = append(args, extra...)
	args = append(args, extraFlags...)
	s.cmd = exec.Command(bin, args...)
	s.cmd.Env = append(os.Environ(), s.env...)
	s.cmd.Stderr = s.log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.waited = make(chan struct{})
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			if _, rest, ok := strings.Cut(line, " serving at "); ok && strings.HasPrefix(line, "kernelgate ") {
				select {
				case urls <- strings.TrimSpace(rest):
				default:
				}
			}
		}
		io.Copy(io.Discard, out)
	}()
	go func() {
		s.cmd.Wait()
		close(s.waited)
	}()
	select {
	case s.url = <-urls:
	case <-s.waited:
		s.stop()
		return nil, fmt.Errorf("%s exited before serving: %s", name, strings.TrimSpace(s.log.String()))
	case <-ctx.Done():
		s.stop()
		return nil, fmt.Errorf("%s did not serve: %w", name, ctx.Err())
	}
	s.http = newHTTPClient()
	return s, nil
}

// startJupyterServer starts Debian's jupyter_server on a free loopback
// port with a token and the project's kernelspecs, and returns once
// GET /api answers.
func startJupyterServer(ctx context.Context) (*server, error) {
	dir, err := os.MkdirTemp("", "jsbench-")
	if err != nil {
		return nil, err
	}
	s := &server{name: "Jupyter Server", token: "bench-" + strconv.Itoa(os.Getpid()), dir: dir, log: tailbuf.New(8 << 10)}
	jpath := filepath.Join(dir, "path")
	root := filepath.Join(dir, "root")
	for _, d := range []string{jpath, root, filepath.Join(dir, "config"), filepath.Join(dir, "data")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := os.Symlink(specDir, filepath.Join(jpath, "kernels")); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.cmd = exec.Command("/usr/bin/python3", "-m", "jupyter_server", "--allow-root", "--no-browser",
		"--ip=127.0.0.1", "--port="+strconv.Itoa(port), "--port-retries=0",
		"--ServerApp.token="+s.token, "--ServerApp.root_dir="+root, "--log-level=WARN")
	s.cmd.Env = append(os.Environ(),
		"JUPYTER_PATH="+jpath,
		"JUPYTER_CONFIG_DIR="+filepath.Join(dir, "config"),
		"JUPYTER_DATA_DIR="+filepath.Join(dir, "data"),
		"JUPYTER_RUNTIME_DIR="+filepath.Join(dir, "runtime"),
		"JUPYTER_PLATFORM_DIRS=0",
		"PYDEVD_DISABLE_FILE_VALIDATION=1")
	s.cmd.Dir = root
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.waited = make(chan struct{})
	go func() {
		s.cmd.Wait()
		close(s.waited)
	}()
	s.url = "http://127.0.0.1:" + strconv.Itoa(port) + "/"
	s.http = newHTTPClient()
	for {
		if status, _, err := s.do(ctx, "GET", "api", nil); err == nil && status == 200 {
			return s, nil
		}
		select {
		case <-s.waited:
			s.stop()
			return nil, fmt.Errorf("jupyter_server exited: %s", strings.TrimSpace(s.log.String()))
		case <-ctx.Done():
			s.stop()
			return nil, fmt.Errorf("jupyter_server did not answer: %w; %s", ctx.Err(), strings.TrimSpace(s.log.String()))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop sends SIGTERM, waits up to 30 s (the gateways shut their kernels
// down), then kills the process group, and removes the scratch directory.
func (s *server) stop() {
	s.once.Do(func() {
		if s.cmd.Process != nil {
			s.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.waited:
			case <-time.After(30 * time.Second):
				syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
				<-s.waited
			}
			// Kernels of Jupyter Server live in process groups of their own;
			// anything left in the server's group goes with it.
			syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		}
		if s.http != nil {
			s.http.CloseIdleConnections()
		}
		os.RemoveAll(s.dir)
	})
}

func (s *server) pid() int { return s.cmd.Process.Pid }

func newHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute,
		DisableCompression: true,
	}}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// cpuTime is the CPU time (user + system) a process has used: the sum of
// its threads' run time from /proc/<pid>/task/*/schedstat (nanoseconds),
// or utime+stime from /proc/<pid>/stat (10 ms ticks) if that fails. The
// stat figure also counts threads that have exited; cpuTicks returns it.
func cpuTime(pid int) (time.Duration, error) {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err == nil {
		var sum time.Duration
		ok := true
		for _, t := range tasks {
			b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + t.Name() + "/schedstat")
			if err != nil {
				ok = false
				break
			}
			f := strings.Fields(string(b))
			if len(f) == 0 {
				ok = false
				break
			}
			n, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				ok = false
				break
			}
			sum += time.Duration(n)
		}
		if ok {
			return sum, nil
		}
	}
	return cpuTicks(pid)
}

// cpuTicks is utime+stime of pid from /proc/<pid>/stat.
func cpuTicks(pid int) (time.Duration, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, err
	}
	st, err := p.Stat()
	if err != nil {
		return 0, err
	}
	return time.Duration(st.UTime+st.STime) * 10 * time.Millisecond, nil
}

// memStatus returns VmRSS and VmHWM of pid in bytes.
func memStatus(pid int) (rss, hwm int64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmRSS":
			rss = n << 10
		case "VmHWM":
			hwm = n << 10
		}
	}
	return rss, hwm, nil
}

// resetPeak resets VmHWM of pid to its current RSS (Linux clear_refs 5).
func resetPeak(pid int) error {
	return os.WriteFile("/proc/"+strconv.Itoa(pid)+"/clear_refs", []byte("5"), 0)
}

// selfCPU is the CPU time of this process.
func selfCPU() time.Duration {
	var r syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r)
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// wakeups is the number of context switches of all threads of pid: how
// often the process ran, which an idle process should not.
func wakeups(pid int) int64 {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return 0
	}
	var n int64
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + t.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if ok && (k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches") {
				c, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += c
			}
		}
	}
	return n
}

//go:build linux

package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/needs"
	"kernelgate/internal/testkernels"
)

// These tests run the real binary against real Jupyter clients: the
// @jupyterlab/services library and the classic notebook in Chromium.

// buildBinary builds kernelgate once per test binary run.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kernelgate")
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// gatewayProcess is a running kernelgate.
type gatewayProcess struct {
	cmd  *exec.Cmd
	url  string
	logs *lockedBuffer
	done chan error
}

// startGateway runs kernelgate serve on a free port and waits for its URL.
func startGateway(t *testing.T, bin string, args ...string) *gatewayProcess {
	t.Helper()
	return startGatewayArgs(t, bin, append([]string{"serve", "--port", "0", "--kernelspec-dir", kernelsDir(t)}, args...)...)
}

// startGatewayArgs is startGateway with the whole command line given.
func startGatewayArgs(t *testing.T, bin string, args ...string) *gatewayProcess {
	t.Helper()
	cmd := exec.Command(bin, args...)
	// Each gateway keeps its state in a directory of its own test, not
	// in the user's (--state-dir given in args wins).
	cmd.Env = append(os.Environ(), "KERNELGATE_LOG_LEVEL=info", "XDG_STATE_HOME="+t.TempDir())
	stdout, _ := cmd.StdoutPipe()
	logs := &lockedBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &gatewayProcess{cmd: cmd, logs: logs, done: make(chan error, 1)}
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if _, u, ok := strings.Cut(sc.Text(), "serving at "); ok {
				urls <- u
			}
		}
	}()
	go func() { p.done <- cmd.Wait() }()
	select {
	case p.url = <-urls:
	case err := <-p.done:
		t.Fatalf("kernelgate exited: %v\n%s", err, logs)
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("kernelgate did not print its URL\n%s", logs)
	}
	t.Cleanup(func() { p.stop(t) })
	return p
}

// stop sends SIGTERM and checks kernelgate exits 0 leaving no kernel behind.
func (p *gatewayProcess) stop(t *testing.T) {
	t.Helper()
	if p.cmd.ProcessState != nil {
		return
	}
	kids := descendants(p.cmd.Process.Pid)
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("kernelgate exit: %v\n%s", err, p.logs)
		}
	case <-time.After(40 * time.Second):
		p.cmd.Process.Kill()
		t.Errorf("kernelgate did not exit after SIGTERM\n%s", p.logs)
	}
	for _, pid := range kids {
		if syscall.Kill(pid, 0) == nil {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !strings.Contains(string(b), ") Z ") {
				t.Errorf("process %d outlived kernelgate: %s", pid, b)
			}
		}
	}
}

// descendants lists the processes below pid.
func descendants(pid int) []int {
	parents := map[int]int{}
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		var p, pp int
		if _, err := fmt.Sscan(e.Name(), &p); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		fmt.Sscan(strings.Fields(s[strings.LastIndexByte(s, ')')+1:])[1], &pp)
		parents[p] = pp
	}
	var out []int
	var walk func(int)
	walk = func(parent int) {
		for p, pp := range parents {
			if pp == parent {
				out = append(out, p)
				walk(p)
			}
		}
	}
	walk(pid)
	return out
}

// lockedBuffer collects a process's output for error messages.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func kernelsDir(t *testing.T) string {
	t.Helper()
	return testkernels.Dir(t)
}

// node runs a script of e2e/ with env, failing the test on a non-zero exit.
func node(t *testing.T, script string, env ...string) {
	t.Helper()
	nodeIn(t, "e2e", script, env...)
}

// nodeIn runs a script of dir with env, failing the test on a non-zero exit.
func nodeIn(t *testing.T, dir, script string, env ...string) {
	t.Helper()
	if _, err := os.Stat(dir + "/node_modules"); err != nil {
		t.Fatalf("%s/node_modules missing: run `make test-deps`", dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	t.Logf("%s:\n%s", script, out)
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
}

func TestJupyterLabServices(t *testing.T) {
	bin := buildBinary(t)
	gw := startGateway(t, bin, "--token", "e2e-token")
	node(t, "jupyterlab-services.mjs", "KERNELGATE_URL="+gw.url, "KERNELGATE_TOKEN=e2e-token")
}

func TestBrowserNotebook(t *testing.T) {
	bin := buildBinary(t)
	gw := startGateway(t, bin, "--token", "web-token")
	env := []string{"KERNELGATE_URL=" + gw.url, "KERNELGATE_TOKEN=web-token"}
	if _, err := os.Stat(filepath.Join(kernelsDir(t), "ir", "kernel.json")); err != nil {
		// The other steps run without R; under KERNELGATE_REQUIRE_ALL a
		// missing R fails the test.
		if needs.Required() {
			t.Fatalf("no ir kernelspec for the R steps (R with IRkernel): run make kernels (%v)", err)
		}
		t.Logf("no ir kernelspec: the R steps are left out (%v)", err)
		env = append(env, "E2E_SKIP_R=1")
	}
	nodeIn(t, "web", "e2e/notebook.mjs", env...)
}

func TestClassicNotebookThroughGateway(t *testing.T) {
	if _, err := exec.Command("/usr/bin/python3", "-c", "import notebook").CombinedOutput(); err != nil {
		t.Fatal("the classic notebook is missing: run `make test-deps` (Debian package jupyter-notebook)")
	}
	bin := buildBinary(t)
	gw := startGateway(t, bin, "--token", "gw-token")

	dir := t.TempDir()
	nb := `{"cells": [{"cell_type": "code", "execution_count": null, "metadata": {}, "outputs": [], "source": []}],
 "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
 "nbformat": 4, "nbformat_minor": 5}`
	if err := os.WriteFile(filepath.Join(dir, "t.ipynb"), []byte(nb), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	cmd := exec.Command("/usr/bin/python3", "-m", "notebook", "--allow-root", "--no-browser",
		"--ip=127.0.0.1", fmt.Sprintf("--port=%d", port), "--NotebookApp.token=nb-token",
		"--notebook-dir="+dir, "--gateway-url="+strings.TrimSuffix(gw.url, "/"), "--GatewayClient.auth_token=gw-token")
	cmd.Env = append(os.Environ(), "JUPYTER_CONFIG_DIR="+t.TempDir(), "JUPYTER_DATA_DIR="+t.TempDir(), "JUPYTER_RUNTIME_DIR="+t.TempDir())
	logs := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		cmd.Wait()
	}()
	nbURL := fmt.Sprintf("http://127.0.0.1:%d/", port)
	waitHTTP(t, nbURL+"api", 60*time.Second)
	node(t, "classic-notebook.mjs", "NOTEBOOK_URL="+nbURL, "NOTEBOOK_TOKEN=nb-token", "NOTEBOOK_FILE=t.ipynb")
	if t.Failed() {
		t.Logf("notebook server:\n%s", logs.String())
	}
}

// Deno publishes some results after its idle status; through Jupyter
// Server's GatewayClient (how JupyterLab runs against a gateway),
// @jupyterlab/services still gets every result within its request. The
// Jupyter Server runs with deploy/jupyter-server/jupyter_server_config.py,
// as README advises: without it, it loses a kernel's first message now
// and then (TestGatewayClientFirstMessage).
func TestDenoResultsThroughJupyterServerGateway(t *testing.T) {
	if _, err := exec.Command("/usr/bin/python3", "-c", "import jupyter_server").CombinedOutput(); err != nil {
		t.Fatal("Jupyter Server is missing: run `make test-deps` (Debian package python3-jupyter-server)")
	}
	bin := buildBinary(t)
	gw := startGateway(t, bin, "--token", "gw-token")
	js := startJupyterServer(t, gw.url, "gw-token", workaroundConfig(t))
	node(t, "gateway-deno.mjs", "SERVER_URL="+js.url, "SERVER_TOKEN="+js.token)
	if t.Failed() {
		t.Logf("Jupyter Server:\n%s", js.logs.String())
	}
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitHTTP polls url until it answers, failing the test after d.
func waitHTTP(t *testing.T, url string, d time.Duration) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("%s did not answer within %v", url, d)
		}
	}
}

func TestMCPTypeScriptSDK(t *testing.T) {
	bin := buildBinary(t)
	gw := startGateway(t, bin, "--token", "mcp-token")
	node(t, "mcp.mjs", "KERNELGATE_URL="+gw.url, "KERNELGATE_TOKEN=mcp-token")
}

func TestE2BSDK(t *testing.T) {
	bin := buildBinary(t)
	gw := startGateway(t, bin, "--token", "e2b-token-0123456789")
	node(t, "e2b.mjs", "KERNELGATE_URL="+gw.url, "KERNELGATE_TOKEN=e2b-token-0123456789")
}

package gateway

// The attack and bad-input checklist (B4 in the security reference): one
// test per case that applies to a gateway on one machine, each checking the
// safe behaviour against real kernels, in checklist_*_test.go by section.
// docs/security.md maps every case to its test, to the older test that
// already covers it, or says why it does not apply. This file holds the
// helpers of every section.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/needs"
	"kernelgate/internal/sysproc"
	"kernelgate/jupyter"
	"kernelgate/provision/local"
	"kernelgate/runs"
	"kernelgate/sessions"
)

// b4Logs makes the gateway log at debug level into a buffer.
func b4Logs(buf *lockedBuffer) gwOption {
	return func(_ *sessions.Config, c *Config) {
		c.testLogger = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
}

// b4Sandboxed runs the gateway's kernels in bubblewrap.
func b4Sandboxed(sb local.SandboxConfig) gwOption {
	return func(m *sessions.Config, _ *Config) { m.Sandbox = &sb }
}

// b4NeedSandbox skips when bubblewrap is missing or cannot make namespaces.
func b4NeedSandbox(t *testing.T) {
	t.Helper()
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		bwrap = "/usr/bin/bwrap"
	}
	if out, err := exec.Command(bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--", "/bin/true").CombinedOutput(); err != nil {
		needs.Skip(t, "bubblewrap cannot sandbox here: %v: %s", err, out)
	}
}

// b4NeedCgroup skips when the kernel process pid was not put in a cgroup
// of kernelgate's (the machine offers no writable memory/pids cgroups).
func b4NeedCgroup(t *testing.T, pid int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil || !strings.Contains(string(b), "/kernelgate/") {
		needs.Skip(t, "kernel not in a kernelgate cgroup (no writable cgroups here): %s", b)
	}
}

// b4HostDir is a fresh directory outside /tmp and /var/tmp, which every
// sandbox hides anyway, removed at the end of the test.
func b4HostDir(t *testing.T) string {
	t.Helper()
	for _, parent := range []string{"/var/lib", os.Getenv("HOME")} {
		if parent == "" {
			continue
		}
		if dir, err := os.MkdirTemp(parent, "kernelgate-b4-"); err == nil {
			t.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	needs.Skip(t, "no writable directory outside /tmp")
	return ""
}

// b4Stdout is the stdout of a run.
func b4Stdout(e runs.Execution) string { return strings.Join(e.Logs.Stdout, "") }

// b4Result is the text of the run's main result, or "".
func b4Result(e runs.Execution) string {
	for _, r := range e.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}

// b4JSON runs Python code in ctx (shared kernel when "") that prints one
// JSON value and decodes it into v.
func b4JSON(t *testing.T, g *testGateway, ctx, code string, v any) {
	t.Helper()
	body := map[string]any{"code": code}
	if ctx != "" {
		body["context"] = ctx
	}
	e := g.run(body)
	if e.Error != nil {
		t.Fatalf("probe failed: %s: %s\n%s", e.Error.Name, e.Error.Value, strings.Join(e.Error.Traceback, "\n"))
	}
	out := strings.TrimSpace(b4Stdout(e))
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("probe printed %q: %v", out, err)
	}
}

// b4Context creates a context and returns its model.
func b4Context(t *testing.T, g *testGateway, body map[string]any) sessions.ContextModel {
	t.Helper()
	status, out := g.do("POST", "/api/contexts", body)
	if status != http.StatusCreated {
		t.Fatalf("POST /api/contexts %v: %d %s", body, status, out)
	}
	return decode[sessions.ContextModel](t, out)
}

// b4WSResult runs code over a kernel websocket and returns the text of
// its execute_result (Deno may publish it just after idle).
func b4WSResult(t *testing.T, c *wsClient, code string) string {
	t.Helper()
	_, iopub := c.run(code)
	if got := resultText(t, iopub); got != "" {
		return got
	}
	got := c.until(5*time.Second, func(m wsMsg) bool { return m.Header.MsgType == jupyter.ExecuteResult })
	return stripANSI(got[len(got)-1].text(t))
}

// b4Dial opens the kernel websocket with a session id of its own.
func b4Dial(t *testing.T, g *testGateway, kernelID, session string, v1 bool) *wsClient {
	t.Helper()
	c, _, err := g.dial(kernelID, session, v1, nil)
	if err != nil {
		t.Fatalf("websocket %s: %v", session, err)
	}
	return c
}

// b4ConnFile returns the path and contents of the connection file of the
// kernel process pid (or of the bwrap that runs it), read from its
// command line (-f for ipykernel, --conn for Deno).
func b4ConnFile(t *testing.T, pid int) (string, jupyter.ConnInfo) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(string(b), "\x00")
	for i, a := range args {
		if (a == "-f" || a == "--conn") && i+1 < len(args) {
			js, err := os.ReadFile(args[i+1])
			if err != nil {
				t.Fatal(err)
			}
			var ci jupyter.ConnInfo
			if err := json.Unmarshal(js, &ci); err != nil {
				t.Fatalf("%s: %v", args[i+1], err)
			}
			return args[i+1], ci
		}
	}
	t.Fatalf("no connection file in the command line of %d: %q", pid, args)
	return "", jupyter.ConnInfo{}
}

// b4Procs lists the processes whose command line or environment mentions
// dir (a kernel, its children and their orphans all have HOME below the
// runtime directory).
func b4Procs(dir string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		for _, f := range []string{"cmdline", "environ"} {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
			if err == nil && bytes.Contains(b, []byte(dir)) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// b4Raw sends one raw HTTP/1.1 request (the target exactly as given) and
// returns the response with its body read.
func b4Raw(t *testing.T, g *testGateway, method, target string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	u, _ := url.Parse(g.url)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", method, target, u.Host)
	for k, v := range hdr {
		fmt.Fprintf(&b, "%s: %s\r\n", k, v)
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body
}

// b4Port is the gateway's TCP port.
func b4Port(g *testGateway) string {
	u, _ := url.Parse(g.url)
	return u.Port()
}

// b4ExecuteFrame is a legacy JSON websocket frame of an execute_request.
func b4ExecuteFrame(channel, session, msgID, code string) []byte {
	b, _ := json.Marshal(map[string]any{
		"header": map[string]any{"msg_id": msgID, "msg_type": "execute_request", "session": session,
			"username": "b4", "date": time.Now().UTC().Format(time.RFC3339Nano), "version": "5.3"},
		"parent_header": map[string]any{},
		"metadata":      map[string]any{},
		"content": map[string]any{"code": code, "silent": false, "store_history": true,
			"user_expressions": map[string]any{}, "allow_stdin": false, "stop_on_error": false},
		"channel": channel,
	})
	return b
}

// b4Errorish reports text that an error body must never carry: tracebacks,
// panics, source files, paths of the gateway.
func b4Errorish(body []byte) string {
	for _, bad := range []string{"goroutine ", "panic", ".go:", "Traceback", "runtime error", "/work/", "/usr/local/go"} {
		if bytes.Contains(body, []byte(bad)) {
			return bad
		}
	}
	return ""
}

// b4Sep is what joins one more parameter to query.
func b4Sep(query string) string {
	if query == "" {
		return "?"
	}
	return "&"
}

// b4SendBody sends a request of size body bytes on a raw connection and
// returns the status and how many body bytes were sent when the answer
// came.
func b4SendBody(t *testing.T, g *testGateway, path string, size int64, chunked bool) (int, int64) {
	t.Helper()
	u, _ := url.Parse(g.url)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: token %s\r\nContent-Type: application/json\r\n", path, u.Host, testToken)
	if chunked {
		head += "Transfer-Encoding: chunked\r\n\r\n"
	} else {
		head += fmt.Sprintf("Content-Length: %d\r\n\r\n", size)
	}
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	var sent atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		chunk := bytes.Repeat([]byte("x"), 1<<20)
		copy(chunk, `{"code":"`)
		for sent.Load() < size {
			var err error
			if chunked {
				if _, err = fmt.Fprintf(conn, "%x\r\n", len(chunk)); err == nil {
					if _, err = conn.Write(chunk); err == nil {
						_, err = io.WriteString(conn, "\r\n")
					}
				}
			} else {
				_, err = conn.Write(chunk)
			}
			if err != nil {
				return
			}
			sent.Add(int64(len(chunk)))
		}
	}()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	at := sent.Load()
	if err != nil {
		t.Fatalf("POST %s with %d MiB: %v after %d MiB sent", path, size>>20, err, at>>20)
	}
	resp.Body.Close()
	conn.Close()
	<-done
	return resp.StatusCode, at
}

// b4Escape makes the kernel behind c start a child in a session of its
// own (out of the kernel's process group) and returns its pid; the test
// kills it at the end whatever happens.
func b4Escape(t *testing.T, c *wsClient) int {
	t.Helper()
	pid, err := strconv.Atoi(b4WSResult(t, c, "import subprocess; subprocess.Popen(['sleep', '300'], start_new_session=True).pid"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sysproc.Kill(pid, syscall.SIGKILL) })
	return pid
}

// b4Leftovers waits up to d for every process mentioning dir to be gone
// and returns those still there.
func b4Leftovers(dir string, d time.Duration) []int {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		left := b4Procs(dir)
		if len(left) == 0 {
			return nil
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return left
		}
	}
}

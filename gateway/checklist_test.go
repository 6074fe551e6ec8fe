package gateway

// The attack and bad-input checklist (B4 in the security reference): one
// test per case that applies to a gateway on one machine, each checking the
// safe behaviour against real kernels. docs/security.md maps every case to
// its test, to the older test that already covers it, or says why it does
// not apply.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/websocket"

	"kernelgate/jupyter"
	"kernelgate/sessions"
	"kernelgate/web"
)

// ---------------------------------------------------------------------------
// Helpers of the checklist.

// b4Logs makes the gateway log at debug level into a buffer.
func b4Logs(buf *lockedBuffer) gwOption {
	return func(_ *sessions.Config, c *Config) {
		c.testLogger = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
}

// b4Sandboxed runs the gateway's kernels in bubblewrap.
func b4Sandboxed(sb jupyter.SandboxConfig) gwOption {
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
		t.Skipf("bubblewrap cannot sandbox here: %v: %s", err, out)
	}
}

// b4NeedCgroup skips when the kernel process pid was not put in a cgroup
// of kernelgate's (the machine offers no writable memory/pids cgroups).
func b4NeedCgroup(t *testing.T, pid int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil || !strings.Contains(string(b), "/kernelgate/") {
		t.Skipf("kernel not in a kernelgate cgroup (no writable cgroups here): %s", b)
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
	t.Skip("no writable directory outside /tmp")
	return ""
}

// b4Stdout is the stdout of a run.
func b4Stdout(e sessions.Execution) string { return strings.Join(e.Logs.Stdout, "") }

// b4Result is the text of the run's main result, or "".
func b4Result(e sessions.Execution) string {
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

// b4Children lists the processes whose parent is this test process.
func b4Children() []int {
	self := strconv.Itoa(os.Getpid())
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) > 1 && f[1] == self {
			out = append(out, pid)
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

// ---------------------------------------------------------------------------
// 1-3: origins and credentials.

// B4 #1: "WS upgrade to /api/kernels/{id}/channels with Origin:
// https://evil.example (+valid cookie/no token)" → "403 before upgrade;
// kernel untouched (CVE-2014-3429)".
//
// TestOriginCheck (security_test.go) checks a foreign origin with a valid
// token. This adds the query token, cookies (never credentials), the
// gateway without a token (loopback only), DNS rebinding (Origin and Host
// both the attacker's name, which resolves to 127.0.0.1), and that the
// kernel saw nothing.
func TestB4_01_OriginEvil(t *testing.T) {
	const evil = "https://evil.example"
	g := newGateway(t, func(_ *sessions.Config, c *Config) { c.AllowOrigins = []string{"https://app.example.com"} })
	k := g.startKernel("python3")
	kk, _ := g.mgr.Kernel(k.ID)
	for _, c := range []struct {
		name, query string
		hdr         http.Header
		want        int
	}{
		{"header token", "", http.Header{"Authorization": {"token " + testToken}, "Origin": {evil}}, http.StatusForbidden},
		{"query token", "?token=" + testToken, http.Header{"Origin": {evil}}, http.StatusForbidden},
		{"cookie only", "", http.Header{"Cookie": {"token=" + testToken + "; _xsrf=1"}, "Origin": {evil}}, http.StatusUnauthorized},
		{"no credentials", "", http.Header{"Origin": {evil}}, http.StatusUnauthorized},
	} {
		conn, resp, err := g.dialURL(k.ID, c.query+b4Sep(c.query)+"session_id=evil", c.hdr)
		if err == nil {
			conn.Close()
			t.Errorf("%s: the upgrade succeeded", c.name)
			continue
		}
		if resp == nil || resp.StatusCode != c.want {
			t.Errorf("%s: %v, want %d before the upgrade", c.name, err, c.want)
		}
	}
	if n := kk.Model().Connections; n != 0 {
		t.Errorf("%d clients attached after refused upgrades", n)
	}
	// Nothing reached the kernel: the first request it answers is ours.
	c := g.mustDial(k.ID, true)
	reply, _ := c.run("1")
	var r struct {
		ExecutionCount int `json:"execution_count"`
	}
	decodeInto(t, reply.Content, &r)
	if r.ExecutionCount != 1 {
		t.Errorf("execution_count %d: the kernel ran code before", r.ExecutionCount)
	}

	t.Run("no token", func(t *testing.T) {
		g := newGateway(t, func(_ *sessions.Config, c *Config) { c.Token = "" })
		k := g.startKernel("python3")
		kk, _ := g.mgr.Kernel(k.ID)
		if _, resp, err := g.dialURL(k.ID, "", http.Header{"Origin": {evil}}); err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Errorf("foreign origin without a token: %v, want 403", err)
		}
		// DNS rebinding: rebind.example resolves to 127.0.0.1 after the
		// page loaded, so the browser sends Host and Origin of the
		// attacker's name, which then look "same-origin".
		host := "rebind.example:" + b4Port(g)
		conn, resp, err := g.dialURL(k.ID, "", http.Header{"Origin": {"http://" + host}, "Host": {host}})
		if err == nil {
			conn.Close()
			t.Errorf("DNS rebinding: websocket to the kernel opened (Host and Origin %s); want 403: without credentials only loopback Host names may be served", host)
		} else if resp == nil || (resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusMisdirectedRequest) {
			t.Errorf("DNS rebinding websocket: %v", err)
		}
		req, _ := http.NewRequest("POST", g.url+"/api/execute", strings.NewReader(`{"code":"1"}`))
		req.Host = host
		req.Header.Set("Origin", "http://"+host)
		req.Header.Set("Content-Type", "application/json")
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("DNS rebinding: POST /api/execute with Host %s answered %d; want 403", host, resp.StatusCode)
		}
		eventually(t, 5*time.Second, func() bool { return kk.Model().Connections == 0 })
	})
}

// b4Sep is what joins one more parameter to query.
func b4Sep(query string) string {
	if query == "" {
		return "?"
	}
	return "&"
}

// B4 #2: "Origin https://app.example.com.evil.net / https://app.example.com@evil
// vs allowed https://app.example.com" → "403 (CVE-2026-40110 prefix bypass)".
//
// TestOriginCheck covers the suffix variant; this adds userinfo, case,
// scheme, port, path and fragment variants, the same-host rule, and CORS
// headers on REST. The origin is checked before the kernel is looked up, so
// no kernel is needed: an allowed origin gets 404 (unknown kernel), a
// refused one 403.
func TestB4_02_OriginPrefix(t *testing.T) {
	const allowed = "https://app.example.com"
	g := newGateway(t, func(_ *sessions.Config, c *Config) { c.AllowOrigins = []string{allowed} })
	kernel := uuid.NewString()
	auth := http.Header{"Authorization": {"token " + testToken}}
	self := "127.0.0.1:" + b4Port(g)
	upgrade := func(origin string) int {
		h := auth.Clone()
		h.Set("Origin", origin)
		conn, resp, err := g.dialURL(kernel, "", h)
		if err == nil {
			conn.Close()
			return http.StatusSwitchingProtocols
		}
		if resp == nil {
			t.Fatalf("origin %q: %v", origin, err)
		}
		return resp.StatusCode
	}
	if got := upgrade(allowed); got != http.StatusNotFound {
		t.Fatalf("allowed origin: %d, want 404 (passed the origin check, unknown kernel)", got)
	}
	if got := upgrade("http://" + self); got != http.StatusNotFound {
		t.Fatalf("the gateway's own origin: %d, want 404", got)
	}
	for _, origin := range []string{
		"https://app.example.com.evil.net",
		"https://app.example.com@evil",
		"https://app.example.com@evil.example",
		"https://app.example.com:443@evil.example",
		"https://evil.example#https://app.example.com",
		"https://evil.example/https://app.example.com",
		"https://app.example.com/",
		"https://app.example.com.",
		"https://APP.EXAMPLE.COM",
		"http://app.example.com",
		"wss://app.example.com",
		"https://app.example.co",
		"https://xapp.example.com",
		"https://app.example.com:8443",
		"null",
		"http://user@" + self,
		"http://" + self + "@evil.example",
		"http://" + self + ".evil.example",
	} {
		if got := upgrade(origin); got != http.StatusForbidden {
			t.Errorf("websocket with Origin %q: %d, want 403", origin, got)
		}
		// CORS: no grant for it, preflight or not.
		for _, method := range []string{"OPTIONS", "GET"} {
			req, _ := http.NewRequest(method, g.url+"/api/kernels", nil)
			req.Header.Set("Origin", origin)
			req.Header.Set("Authorization", "token "+testToken)
			if method == "OPTIONS" {
				req.Header.Set("Access-Control-Request-Method", "POST")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if acao := resp.Header.Get("Access-Control-Allow-Origin"); acao != "" {
				t.Errorf("%s with Origin %q: Access-Control-Allow-Origin %q", method, origin, acao)
			}
		}
	}
}

// B4 #3: "Missing/wrong/short/long/Bearer-vs-token prefixed token on every
// REST route, WS upgrade and HEAD/OPTIONS" → "401 (OPTIONS: preflight
// headers only); no kernel started; timing does not depend on prefix match".
//
// TestAuthOnEveryRoute (security_test.go) covers the Jupyter routes with
// four variants. This walks every route the server has registered (the
// code-interpreter surface and /metrics too) with more variants, HEAD and
// OPTIONS, and the websocket upgrade. Timing is not tested: the comparison
// hashes both secrets with SHA-256 and compares the digests in constant
// time (equalSecret), which a timing test could not show reliably.
func TestB4_03_Credentials(t *testing.T) {
	g := newGateway(t)
	public := map[string]bool{"/api": true, "/healthz": true, "/readyz": true, "/api/openapi.json": true}
	creds := []struct {
		name string
		hdr  map[string]string
	}{
		{"missing", nil},
		{"empty token", map[string]string{"Authorization": "token "}},
		{"empty bearer", map[string]string{"Authorization": "Bearer"}},
		{"short", map[string]string{"Authorization": "token t"}},
		{"long", map[string]string{"Authorization": "Bearer " + strings.Repeat("k", 10<<10)}},
		{"prefix of the token", map[string]string{"Authorization": "token " + testToken[:len(testToken)-1]}},
		{"token and one more byte", map[string]string{"Authorization": "token " + testToken + "4"}},
		{"upper-cased token", map[string]string{"Authorization": "Bearer " + strings.ToUpper(testToken)}},
		{"no scheme", map[string]string{"Authorization": testToken}},
		{"basic scheme", map[string]string{"Authorization": "Basic " + testToken}},
		{"cookie", map[string]string{"Cookie": "token=" + testToken + "; kernelgate=" + testToken}},
		{"other header", map[string]string{"X-Auth-Token": testToken}},
	}
	fill := strings.NewReplacer(":id", uuid.NewString(), ":name", "python3", "*", "logo-64x64.png")
	routes := 0
	for _, r := range g.srv.echo.Routes() {
		if public[r.Path] || !strings.HasPrefix(r.Path, "/") {
			continue
		}
		routes++
		path := fill.Replace(r.Path)
		for _, c := range creds {
			status, body := g.doWith(r.Method, path, nil, c.hdr)
			if status != http.StatusUnauthorized {
				t.Errorf("%s %s (%s): %d %s, want 401", r.Method, path, c.name, status, body)
			}
		}
		// HEAD: 401. OPTIONS (a preflight, here from an origin that is not
		// allowed): 401, or an empty answer with no CORS grant.
		for _, method := range []string{"HEAD", "OPTIONS"} {
			for _, c := range creds[:6] {
				req, _ := http.NewRequest(method, g.url+path, nil)
				for k, v := range c.hdr {
					req.Header.Set(k, v)
				}
				if method == "OPTIONS" {
					req.Header.Set("Origin", "https://evil.example")
					req.Header.Set("Access-Control-Request-Method", "POST")
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				preflightOnly := method == "OPTIONS" && resp.StatusCode == http.StatusNoContent && len(body) == 0 &&
					resp.Header.Get("Access-Control-Allow-Origin") == ""
				if resp.StatusCode != http.StatusUnauthorized && !preflightOnly {
					t.Errorf("%s %s (%s): %d %q, want 401", method, path, c.name, resp.StatusCode, body)
				}
				if method == "HEAD" && len(body) > 0 {
					t.Errorf("HEAD %s has a body", path)
				}
			}
		}
		// Query tokens are for websockets and kernelspec files only.
		status, _ := g.doWith(r.Method, path+"?token="+testToken, nil, nil)
		queryOK := r.Path == "/kernelspecs/:name/*"
		if !queryOK && status != http.StatusUnauthorized {
			t.Errorf("%s %s?token=: %d, want 401", r.Method, path, status)
		}
	}
	if routes < 30 {
		t.Errorf("only %d routes checked", routes)
	}
	for _, c := range creds {
		h := http.Header{}
		for k, v := range c.hdr {
			h.Set(k, v)
		}
		if conn, resp, err := g.dialURL(uuid.NewString(), "", h); err == nil {
			conn.Close()
			t.Errorf("websocket upgrade (%s) succeeded", c.name)
		} else if resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("websocket upgrade (%s): %v, want 401", c.name, err)
		}
	}
	if n := len(g.mgr.Kernels()); n != 0 {
		t.Errorf("%d kernels started by unauthenticated requests", n)
	}
	if n := len(g.mgr.Contexts()); n != 0 {
		t.Errorf("%d contexts created by unauthenticated requests", n)
	}
}

// ---------------------------------------------------------------------------
// 4-8: what requests may carry.

// B4 #4: "Token only in ?token=; then force a 500" → "request rejected or
// accepted-but-redacted; no token/Cookie/Authorization/Referer query in any
// log line (GHSA-p737, GHSA-c3mw)".
//
// TestLogsHoldNoSecrets (ops_test.go) covers query tokens on successful
// and refused requests. This forces 5xx answers (a kernel that cannot
// start) with the token in the query, a Referer carrying a token and a
// cookie, on both surfaces, and checks logs and bodies.
func TestB4_04_TokenInQueryAnd5xx(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "broken"), 0o755)
	os.WriteFile(filepath.Join(dir, "broken", "kernel.json"), []byte(`{"argv":["/usr/bin/python3","-c","import sys; print('kernel exploded', file=sys.stderr); sys.exit(1)","{connection_file}"],"display_name":"b","language":"python"}`), 0o644)
	var logs lockedBuffer
	g := newGatewayWithDirs(t, []string{dir}, b4Logs(&logs), func(m *sessions.Config, _ *Config) {
		m.Languages = map[string]string{"python": "broken"}
	})
	const (
		queryToken   = "query-secret-0123456789"
		refererToken = "referer-secret-0123456789"
		cookieValue  = "cookie-secret-0123456789"
	)
	hdr := map[string]string{
		"Authorization": "token " + testToken,
		"Content-Type":  "application/json",
		"Referer":       "https://client.example/page?token=" + refererToken,
		"Cookie":        "session=" + cookieValue,
		"User-Agent":    "b4",
	}
	// A query token alone is refused on REST.
	if status, _ := g.doWith("GET", "/api/kernels?token="+testToken, nil, nil); status != http.StatusUnauthorized {
		t.Errorf("?token= alone on REST: %d, want 401", status)
	}
	var bodies [][]byte
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/api/execute?token=" + queryToken, `{"code":"1"}`},
		{"POST", "/api/kernels?token=" + queryToken, `{"name":"broken"}`},
		{"POST", "/api/contexts?token=" + queryToken, `{"language":"python"}`},
	} {
		status, body := g.doWith(c.method, c.path, c.body, hdr)
		if status < 500 {
			t.Fatalf("%s %s: %d %s, want a 5xx", c.method, c.path, status, body)
		}
		bodies = append(bodies, body)
	}
	out := logs.String()
	if !strings.Contains(out, "status=503") {
		t.Fatalf("the 5xx answers were not logged:\n%s", out)
	}
	for _, secret := range []string{testToken, queryToken, refererToken, cookieValue, "token=", "Cookie", "Referer"} {
		if strings.Contains(out, secret) {
			t.Errorf("logs contain %q:\n%s", secret, out)
		}
		for _, b := range bodies {
			if bytes.Contains(b, []byte(secret)) {
				t.Errorf("5xx body contains %q: %s", secret, b)
			}
		}
	}
}

// B4 #5: "Malformed JSON, wrong types, unknown kernel, kernel start
// failure" → "JSON error without traceback/paths (GHSA-h56g); correct
// 4xx/5xx".
//
// TestBadRequests (security_test.go) and TestExecuteErrorCodes
// (interpreter_test.go) cover malformed JSON, unknown kernels and a failed
// start. This adds wrong types, deep nesting, invalid UTF-8 and trailing
// data on every route taking a body, and checks no body carries a
// traceback, a panic or a path.
func TestB4_05_MalformedBodies(t *testing.T) {
	g := newGateway(t)
	deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	common := []string{"{", "[]", `"x"`, "1", "\xff\xfe\xfd", deep, `{"a":1} trailing`}
	routes := []struct {
		method, path string
		bodies       []string
	}{
		{"POST", "/api/execute", append([]string{`{"code": 1}`, `{"code":"1","timeout":"x"}`, `{"code":"1","timeout":1e999}`,
			`{"code":"1","timeout":-1}`, `{"code":"1","isolated":"yes"}`, `{"code":"1","env":{"A":{"b":1}}}`, `{"code":"1","env":[]}`,
			`{"code":"1","language":["python"]}`, `{"code":"1","context":7}`, `null`, `{"code":"1","timeout":1` + strings.Repeat("0", 400) + `}`}, common...)},
		{"POST", "/api/contexts", append([]string{`{"id": 5}`, `{"language": 5}`, `{"env": []}`, `{"env": {"A": 5}}`, `{"cwd": {}}`}, common...)},
		{"POST", "/api/kernels", append([]string{`{"name": 5}`, `{"env": "x"}`, `{"env": {"KERNEL_A": 1}}`, `{"kernel_id": 5}`, `{"path": []}`}, common...)},
		{"POST", "/api/sessions", append([]string{`{"path": 5}`, `{"kernel": "x"}`, `{"path":"a.ipynb","kernel":{"name":7}}`}, common...)},
	}
	for _, r := range routes {
		for _, b := range r.bodies {
			status, body := g.doWith(r.method, r.path, b, map[string]string{"Authorization": "token " + testToken, "Content-Type": "application/json"})
			short := b
			if len(short) > 40 {
				short = short[:40] + "…"
			}
			if status != http.StatusBadRequest {
				t.Errorf("%s %s %q: %d %s, want 400", r.method, r.path, short, status, body)
				continue
			}
			var m map[string]any
			if err := json.Unmarshal(body, &m); err != nil || m["message"] == "" {
				t.Errorf("%s %s %q: body %s is not a JSON error", r.method, r.path, short, body)
			}
			if bad := b4Errorish(body); bad != "" {
				t.Errorf("%s %s %q: body carries %q: %s", r.method, r.path, short, bad, body)
			}
			if bytes.Contains(body, []byte("Go struct")) || bytes.Contains(body, []byte("gateway.")) {
				t.Logf("note: %s %s %q: the message names Go types: %s", r.method, r.path, short, body)
			}
		}
	}
	if n := len(g.mgr.Kernels()); n != 0 {
		t.Errorf("%d kernels started by malformed requests", n)
	}
	// Unknown kernels and runs: 404 with a JSON body.
	for _, p := range []string{"/api/kernels/" + uuid.NewString(), "/api/runs/" + uuid.NewString(), "/api/contexts/nope", "/api/sessions/" + uuid.NewString()} {
		status, body := g.do("GET", p, nil)
		if status != http.StatusNotFound || b4Errorish(body) != "" {
			t.Errorf("GET %s: %d %s", p, status, body)
		}
	}
}

// B4 #6: "POST /api/kernels with text/plain or form body + cookie" →
// "415/403 (CVE-2016-9971 CSRF)".
//
// TestJupyterBodiesContentType (security_test.go) covers form bodies with
// a valid token (415) and text/plain on the code-interpreter API (415).
// This adds cookies (never credentials) and the gateway without a token,
// where a page of any origin can send a "simple" cross-site POST (no
// preflight): it must not start kernels or sessions.
func TestB4_06_CrossSiteBodies(t *testing.T) {
	g := newGateway(t)
	for _, p := range []string{"/api/kernels", "/api/execute", "/api/sessions", "/api/contexts"} {
		status, body := g.doWith("POST", p, "name=python3", map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Cookie": "token=" + testToken})
		if status != http.StatusUnauthorized {
			t.Errorf("POST %s with a cookie and a form: %d %s, want 401", p, status, body)
		}
	}

	t.Run("no token", func(t *testing.T) {
		g := newGateway(t, func(_ *sessions.Config, c *Config) { c.Token = "" })
		bodies := map[string]string{
			"/api/kernels":  `{"name":"python3"}`,
			"/api/sessions": `{"path":"x.ipynb","type":"notebook","kernel":{"name":"python3"}}`,
			"/api/execute":  `{"code":"open('/tmp/pwned','w')"}`,
			"/api/contexts": `{"language":"python"}`,
		}
		for path, body := range bodies {
			for _, ct := range []string{"text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"} {
				status, out := g.doWith("POST", path, body, map[string]string{"Content-Type": ct, "Origin": "https://evil.example"})
				if status != http.StatusForbidden && status != http.StatusUnsupportedMediaType {
					t.Errorf("cross-site POST %s (%s) from https://evil.example: %d %s; want 403 (a request with a foreign Origin must not change state)", path, ct, status, out)
				}
			}
		}
		if n := len(g.mgr.Kernels()); n != 0 {
			t.Errorf("cross-site requests started %d kernels", n)
		}
	})
}

// B4 #7: "Kernel name ../../x, python3/../deno, %2e%2e%2f, PYTHON3,
// homoglyph, 10 kB, empty" → "400/404; no FS access outside spec dirs".
//
// Names are looked up in the catalog read at start (a map), never joined to
// a path. As in jupyter_client, lookups are case-insensitive, so PYTHON3 is
// python3; an empty name is the default kernelspec (Jupyter's behaviour).
func TestB4_07_KernelNames(t *testing.T) {
	g := newGateway(t)
	bad := []string{"../../x", "python3/../deno", "%2e%2e%2f", "..%2f..%2fetc%2fpasswd", "/etc/passwd", "pythоn3" /* Cyrillic о */, "python3\u200b",
		"python３", strings.Repeat("a", 10<<10), " ", "python3 ", "python3\x00", "deno/../python3", "..", "."}
	for _, name := range bad {
		short := name
		if len(short) > 24 {
			short = short[:24] + "…"
		}
		status, body := g.do("POST", "/api/kernels", map[string]any{"name": name})
		if status != http.StatusBadRequest && status != http.StatusNotFound {
			t.Errorf("POST /api/kernels name %q: %d %.200s, want 400 or 404", short, status, body)
		}
		status, body = g.do("GET", "/api/kernelspecs/"+url.PathEscape(name), nil)
		if status != http.StatusNotFound && status != http.StatusBadRequest {
			t.Errorf("GET /api/kernelspecs/%q: %d %.200s, want 404", short, status, body)
		}
		if bytes.Contains(body, []byte("root:")) {
			t.Errorf("GET /api/kernelspecs/%q leaked a file", short)
		}
	}
	// The same names unescaped in the path (the router sees them raw).
	for _, p := range []string{"../../x", "python3/../deno", "%2e%2e%2f", "%2e%2e/%2e%2e/etc/passwd", "..%2f..%2f..%2fetc%2fpasswd"} {
		resp, body := b4Raw(t, g, "GET", "/api/kernelspecs/"+p, map[string]string{"Authorization": "token " + testToken})
		if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusBadRequest {
			t.Errorf("raw GET /api/kernelspecs/%s: %d %.200s", p, resp.StatusCode, body)
		}
	}
	if n := len(g.mgr.Kernels()); n != 0 {
		t.Errorf("%d kernels started for bad names", n)
	}
	// PYTHON3 and the empty name are python3, never anything else.
	status, body := g.do("GET", "/api/kernelspecs/PYTHON3", nil)
	if status != http.StatusOK || decode[kernelspecModel](t, body).Name != "python3" {
		t.Errorf("GET /api/kernelspecs/PYTHON3: %d %.200s", status, body)
	}
	for _, name := range []string{"PYTHON3", ""} {
		status, body := g.do("POST", "/api/kernels", map[string]any{"name": name})
		if status != http.StatusCreated {
			t.Fatalf("POST /api/kernels name %q: %d %s", name, status, body)
		}
		if k := decode[sessions.KernelModel](t, body); k.Name != "python3" {
			t.Errorf("name %q started %q", name, k.Name)
		} else {
			g.do("DELETE", "/api/kernels/"+k.ID, nil)
		}
	}
}

// B4 #8: "Kernelspec resource GET /kernelspecs/python3/../../etc/passwd,
// encoded, absolute, symlink inside resource dir pointing out,
// sibling-prefix dir" → "404 (CVE-2026-35397, GHSA-hrw6)".
//
// TestBadRequests (security_test.go) covers traversal, encodings and
// absolute paths on the real python3 spec, kernelspecs.TestResourcePath
// and FuzzResourcePath the resolver. This adds, through the gateway,
// symlinks pointing out of a spec's folder and a sibling folder whose name
// starts with the spec's.
func TestB4_08_ResourceEscapes(t *testing.T) {
	dir := t.TempDir()
	spec := filepath.Join(dir, "evil")
	sibling := filepath.Join(dir, "evil-sibling")
	os.MkdirAll(spec, 0o755)
	os.MkdirAll(sibling, 0o755)
	os.WriteFile(filepath.Join(spec, "kernel.json"), []byte(`{"argv":["/bin/false","{connection_file}"],"display_name":"evil","language":"python"}`), 0o644)
	os.WriteFile(filepath.Join(spec, "logo-64x64.png"), []byte("PNG-OK"), 0o644)
	os.WriteFile(filepath.Join(sibling, "secret.txt"), []byte("SIBLING-SECRET"), 0o644)
	os.WriteFile(filepath.Join(dir, "outside.txt"), []byte("OUTSIDE-SECRET"), 0o644)
	os.Symlink("/etc/passwd", filepath.Join(spec, "link-abs"))
	os.Symlink("../outside.txt", filepath.Join(spec, "link-rel"))
	os.Symlink("../evil-sibling", filepath.Join(spec, "linkdir"))
	os.Symlink(sibling, filepath.Join(spec, "linkdir-abs"))
	g := newGatewayWithDirs(t, []string{dir})

	auth := map[string]string{"Authorization": "token " + testToken}
	if resp, body := b4Raw(t, g, "GET", "/kernelspecs/evil/logo-64x64.png", auth); resp.StatusCode != http.StatusOK || string(body) != "PNG-OK" {
		t.Fatalf("the spec's own file: %d %q", resp.StatusCode, body)
	}
	for _, p := range []string{
		"/kernelspecs/evil/link-abs",
		"/kernelspecs/evil/link-rel",
		"/kernelspecs/evil/linkdir/secret.txt",
		"/kernelspecs/evil/linkdir-abs/secret.txt",
		"/kernelspecs/evil/../evil-sibling/secret.txt",
		"/kernelspecs/evil/..%2fevil-sibling%2fsecret.txt",
		"/kernelspecs/evil/%2e%2e/evil-sibling/secret.txt",
		"/kernelspecs/evil/..%5cevil-sibling%5csecret.txt",
		"/kernelspecs/evil-sibling/secret.txt",
		"/kernelspecs/evil/../outside.txt",
		"/kernelspecs/evil/%2e%2e%2foutside.txt",
		"/kernelspecs/evil//etc/passwd",
		"/kernelspecs/evil/%2fetc%2fpasswd",
		"/kernelspecs/evil/" + url.PathEscape(filepath.Join(dir, "outside.txt")),
		"/kernelspecs/evil/logo-64x64.png%00.txt",
		"/kernelspecs/evil/.",
		"/kernelspecs/evil/",
	} {
		for _, method := range []string{"GET", "HEAD"} {
			resp, body := b4Raw(t, g, method, p, auth)
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("%s %s: %d %.100q, want 404", method, p, resp.StatusCode, body)
			}
			for _, leak := range []string{"SIBLING-SECRET", "OUTSIDE-SECRET", "root:"} {
				if bytes.Contains(body, []byte(leak)) {
					t.Errorf("%s %s leaked %s", method, p, leak)
				}
			}
		}
	}
}

// ---------------------------------------------------------------------------
// 9-11: the kernel's environment.

// b4DeniedEnv are names a client may never set, each with a value that
// marks it.
var b4DeniedEnv = map[string]string{
	"LD_PRELOAD": "/kg-evil/x.so", "LD_LIBRARY_PATH": "/kg-evil", "PYTHONPATH": "/kg-evil",
	"PYTHONWARNINGS": "ignore::evilmod.X", "PYTHONSTARTUP": "/kg-evil/s.py", "PYTHONHOME": "/kg-evil",
	"PYTHONINSPECT": "kg-evil", "PYTHONBREAKPOINT": "kg_evil.x", "IPYTHONDIR": "/kg-evil",
	"JUPYTER_CONFIG_DIR": "/kg-evil", "JUPYTER_PATH": "/kg-evil", "HOME": "/kg-evil", "PATH": "/kg-evil",
	"DENO_V8_FLAGS": "--kg-evil", "DENO_DIR": "/kg-evil", "DENO_AUTH_TOKENS": "kg-evil@x", "DENO_CERT": "/kg-evil",
	"NODE_OPTIONS": "--require=/kg-evil.js", "HTTPS_PROXY": "http://kg-evil", "https_proxy": "http://kg-evil",
	"ALL_PROXY": "http://kg-evil", "BASH_ENV": "/kg-evil", "ENV": "/kg-evil", "GCONV_PATH": "/kg-evil",
	"KUBERNETES_SERVICE_HOST": "kg-evil", "ld_preload": "/kg-evil/y.so", "Path": "/kg-evil",
	"KERNELGATE_TOKEN": "kg-evil", "MALLOC_CONF": "kg-evil", "XDG_CONFIG_HOME": "/kg-evil",
}

// B4 #9: "env: LD_PRELOAD, PYTHONPATH, PYTHONWARNINGS=ignore::evilmod.X,
// IPYTHONDIR, JUPYTER_CONFIG_DIR, HOME, PATH, DENO_V8_FLAGS, NODE_OPTIONS,
// HTTPS_PROXY" → "400 (or dropped per documented policy); in-kernel
// os.environ/Deno.env proves absence".
//
// Policy: the code-interpreter API refuses such a name with 400; the
// Jupyter API drops every name that is not KERNEL_* or allow-listed, and a
// denied name stays denied even when an operator allow-lists it.
// TestKernelEnvAllowList (security_test.go) and TestExecuteErrorCodes
// cover LD_PRELOAD, PATH and an unlisted name; jupyter/kernelenv_test.go
// the deny list itself.
func TestB4_09_EnvNames(t *testing.T) {
	g := newGateway(t)
	for name, value := range b4DeniedEnv {
		for _, c := range []struct {
			path string
			body map[string]any
		}{
			{"/api/execute", map[string]any{"code": "1", "isolated": true, "env": map[string]string{name: value}}},
			{"/api/execute", map[string]any{"code": "1", "env": map[string]string{name: value}}},
			{"/api/contexts", map[string]any{"language": "python", "env": map[string]string{name: value}}},
			{"/api/contexts", map[string]any{"language": "javascript", "env": map[string]string{name: value}}},
		} {
			status, body := g.do("POST", c.path, c.body)
			if got := decode[map[string]any](t, body); status != http.StatusBadRequest || got["code"] != "BAD_REQUEST" {
				t.Errorf("POST %s env %s: %d %s, want 400", c.path, name, status, body)
			}
		}
	}
	if n := len(g.mgr.Kernels()); n != 0 {
		t.Errorf("%d kernels started with denied variables", n)
	}
	if n := len(g.mgr.Contexts()); n != 0 {
		t.Errorf("%d contexts created with denied variables", n)
	}

	// The Jupyter API drops them; the kernels prove it.
	probes := map[string]string{
		"python3": "import os; sorted(k for k, v in os.environ.items() if 'kg-evil' in v or 'evilmod' in v or 'kg_evil' in v)",
		"deno":    `JSON.stringify(Object.entries(Deno.env.toObject()).filter(([k, v]) => /kg-evil|evilmod|kg_evil/.test(v)).map(([k]) => k))`,
	}
	want := map[string]string{"python3": "[]", "deno": `"[]"`}
	for spec, probe := range probes {
		status, body := g.do("POST", "/api/kernels", map[string]any{"name": spec, "env": b4DeniedEnv})
		if status != http.StatusCreated {
			t.Fatalf("POST /api/kernels %s with denied env: %d %s", spec, status, body)
		}
		k := decode[sessions.KernelModel](t, body)
		c := g.mustDial(k.ID, true)
		if got := b4WSResult(t, c, probe); got != want[spec] {
			t.Errorf("%s kernel sees denied variables: %s", spec, got)
		}
	}

	t.Run("allow-listed by mistake", func(t *testing.T) {
		mistakes := []string{"LD_PRELOAD", "PYTHONPATH", "NODE_OPTIONS", "HTTPS_PROXY", "HOME"}
		g := newGateway(t, func(m *sessions.Config, _ *Config) { m.EnvAllow = mistakes })
		env := map[string]string{}
		for _, n := range mistakes {
			env[n] = b4DeniedEnv[n]
		}
		status, body := g.do("POST", "/api/kernels", map[string]any{"name": "python3", "env": env})
		switch status {
		case http.StatusBadRequest:
		case http.StatusCreated:
			k := decode[sessions.KernelModel](t, body)
			c := g.mustDial(k.ID, true)
			if got := b4WSResult(t, c, probes["python3"]); got != "[]" {
				t.Errorf("kernel sees denied, allow-listed variables: %s", got)
			}
		default:
			t.Errorf("POST /api/kernels with denied but allow-listed names: %d %s; want 400 (a refused variable is the client's error) or the names dropped", status, body)
		}
	})
}

// B4 #10: "env values $(id), backticks, \n, NUL, 1 MiB,
// number/object/null, 10 000 keys" → "400, value not echoed (EG 83f54a88)".
//
// Policy: values reach the kernel through execve's environment, never a
// shell, so $(id), backticks and ${…} are accepted and stay inert (the
// kernel sees them literally); NUL, CR, LF, values over 4096 bytes,
// non-strings and more than 64 variables are refused with 400.
// TestBadRequests covers a number and a newline on POST /api/kernels.
func TestB4_10_EnvValues(t *testing.T) {
	g := newGateway(t)
	const mark = "KG-ECHO-MARK"
	many := map[string]string{}
	manyKernel := map[string]string{}
	for i := 0; i < 10000; i++ {
		many[fmt.Sprintf("V%d", i)] = mark
		manyKernel[fmt.Sprintf("KERNEL_V%d", i)] = mark
	}
	values := map[string]json.RawMessage{}
	for name, v := range map[string]any{
		"newline": "a\n" + mark, "carriage return": "a\r" + mark, "NUL": "a\x00" + mark,
		"4097 bytes": mark + strings.Repeat("x", 4097), "1 MiB": mark + strings.Repeat("x", 1<<20),
		"number": 12345678, "object": map[string]string{"x": mark}, "null": nil, "bool": true, "array": []string{mark},
	} {
		values[name], _ = json.Marshal(v)
	}
	type route struct {
		path   string
		prefix string // of the variable's name
		body   func(env json.RawMessage) string
	}
	routes := []route{
		{"/api/execute", "K", func(env json.RawMessage) string { return `{"code":"1","isolated":true,"env":` + string(env) + `}` }},
		{"/api/contexts", "K", func(env json.RawMessage) string { return `{"language":"python","env":` + string(env) + `}` }},
		{"/api/kernels", "KERNEL_K", func(env json.RawMessage) string { return `{"name":"python3","env":` + string(env) + `}` }},
	}
	for _, r := range routes {
		for name, v := range values {
			env := json.RawMessage(`{"` + r.prefix + `":` + string(v) + `}`)
			status, body := g.doWith("POST", r.path, r.body(env), map[string]string{"Authorization": "token " + testToken, "Content-Type": "application/json"})
			if status != http.StatusBadRequest {
				t.Errorf("POST %s env value %s: %d %.300s, want 400", r.path, name, status, body)
			}
			if bytes.Contains(body, []byte(mark)) || bytes.Contains(body, []byte("12345678")) {
				t.Errorf("POST %s env value %s: the value is echoed: %.300s", r.path, name, body)
			}
		}
		m := many
		if r.path == "/api/kernels" {
			m = manyKernel
		}
		js, _ := json.Marshal(m)
		status, body := g.doWith("POST", r.path, r.body(js), map[string]string{"Authorization": "token " + testToken, "Content-Type": "application/json"})
		if status != http.StatusBadRequest {
			t.Errorf("POST %s with 10 000 variables: %d %.300s, want 400", r.path, status, body)
		}
		if bytes.Contains(body, []byte(mark)) {
			t.Errorf("POST %s with 10 000 variables echoes a value", r.path)
		}
	}
	for _, k := range g.mgr.Kernels() {
		g.do("DELETE", "/api/kernels/"+k.ID(), nil)
	}

	// Shell syntax is inert: the kernel sees it literally.
	inert := map[string]string{"KERNEL_A": "$(id)", "KERNEL_B": "`id`", "KERNEL_C": "${HOME};id|sh"}
	e := g.run(map[string]any{"code": "import os; [os.environ[k] for k in ('KERNEL_A', 'KERNEL_B', 'KERNEL_C')]", "isolated": true, "env": inert})
	if want := "['$(id)', '`id`', '${HOME};id|sh']"; b4Result(e) != want {
		t.Errorf("isolated run sees %q, want %s", b4Result(e), want)
	}
	status, body := g.do("POST", "/api/kernels", map[string]any{"name": "python3", "env": inert})
	if status != http.StatusCreated {
		t.Fatalf("POST /api/kernels with shell syntax in values: %d %s", status, body)
	}
	c := g.mustDial(decode[sessions.KernelModel](t, body).ID, true)
	if got := b4WSResult(t, c, "import os; [os.environ[k] for k in ('KERNEL_A', 'KERNEL_B', 'KERNEL_C')]"); got != "['$(id)', '`id`', '${HOME};id|sh']" {
		t.Errorf("Jupyter kernel sees %s", got)
	}
}

// b4SecretsProbe prints what a kernel finds of the gateway's secrets.
const b4SecretsProbe = `
import hashlib, json, os
def read(p):
    try:
        with open(p, 'rb') as f:
            b = f.read()
        return {'ok': True, 'sha': hashlib.sha256(b).hexdigest(), 'len': len(b),
                'token': TOKEN.encode() in b, 'marker': MARKER.encode() in b}
    except OSError as e:
        return {'ok': False, 'err': type(e).__name__}
env = '\n'.join(k + '=' + v for k, v in os.environ.items())
print(json.dumps({
    'env_token': TOKEN in env or CONFIG_TOKEN in env,
    'env_marker': MARKER in env,
    'env_names': sorted(k for k in os.environ if k.startswith(('KERNELGATE', 'KUBERNETES', 'KG_B4'))),
    'gw_environ': read('/proc/%d/environ' % GWPID),
    'gw_cmdline': read('/proc/%d/cmdline' % GWPID),
    'init_environ': read('/proc/1/environ'),
    'sa_token': read('/var/run/secrets/kubernetes.io/serviceaccount/token'),
}))
`

type b4ReadResult struct {
	OK     bool   `json:"ok"`
	Err    string `json:"err"`
	SHA    string `json:"sha"`
	Len    int    `json:"len"`
	Token  bool   `json:"token"`
	Marker bool   `json:"marker"`
}

type b4Secrets struct {
	EnvToken    bool         `json:"env_token"`
	EnvMarker   bool         `json:"env_marker"`
	EnvNames    []string     `json:"env_names"`
	GWEnviron   b4ReadResult `json:"gw_environ"`
	GWCmdline   b4ReadResult `json:"gw_cmdline"`
	InitEnviron b4ReadResult `json:"init_environ"`
	SAToken     b4ReadResult `json:"sa_token"`
}

// B4 #11: "Gateway secrets in kernel: os.environ, /proc/1/environ,
// /proc/<gateway>/environ, SA token path, KUBERNETES_SERVICE_HOST" → "none
// present/readable (EG test_kernel_env_auth_token)".
//
// A kernel's environment is built from scratch (jupyter.CleanEnv), so
// nothing of the gateway's reaches os.environ. /proc is another matter:
// without the sandbox a kernel runs as the gateway's user and can read
// /proc/<gateway>/environ and cmdline (a token passed by --token or
// KERNELGATE_TOKEN is in one of them); the test records what is true. With
// the sandbox the kernel has a PID namespace and its own /proc: the
// gateway is not there. (t.Setenv changes this process's environment but
// not /proc/self/environ, which holds the environment it was started
// with, so readability is shown by comparing digests of the file.)
func TestB4_11_GatewaySecrets(t *testing.T) {
	const marker = "kg-b4-marker-5f1e0c"
	envToken := "kg-b4-env-token-" + uuid.NewString()
	t.Setenv("KERNELGATE_TOKEN", envToken)
	t.Setenv("KG_B4_MARKER", marker)
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	own, err := os.ReadFile("/proc/self/environ")
	if err != nil {
		t.Fatal(err)
	}
	ownSum := sha256.Sum256(own)
	code := fmt.Sprintf("TOKEN, CONFIG_TOKEN, MARKER, GWPID = %q, %q, %q, %d\n", envToken, testToken, marker, os.Getpid()) + b4SecretsProbe
	probe := func(t *testing.T, g *testGateway) b4Secrets {
		var s b4Secrets
		b4JSON(t, g, "", code, &s)
		if s.EnvToken || s.EnvMarker || len(s.EnvNames) > 0 {
			t.Errorf("the kernel's environment holds gateway variables: token %v, marker %v, names %v", s.EnvToken, s.EnvMarker, s.EnvNames)
		}
		if s.SAToken.OK {
			t.Errorf("a service-account token is readable")
		}
		if s.InitEnviron.Token || s.InitEnviron.Marker {
			t.Errorf("/proc/1/environ holds the gateway's secrets")
		}
		return s
	}

	t.Run("plain", func(t *testing.T) {
		g := newGateway(t)
		s := probe(t, g)
		same := s.GWEnviron.OK && s.GWEnviron.SHA == hex.EncodeToString(ownSum[:])
		t.Logf("without the sandbox: /proc/%d/environ readable=%v (the gateway's whole startup environment: %v, %d bytes), cmdline readable=%v",
			os.Getpid(), s.GWEnviron.OK, same, s.GWEnviron.Len, s.GWCmdline.OK)
		t.Logf("=> an unsandboxed kernel reads any secret the gateway was started with (KERNELGATE_TOKEN in its environment, --token on its command line); run kernels with --sandbox")
	})

	t.Run("sandboxed", func(t *testing.T) {
		b4NeedSandbox(t)
		g := newGateway(t, b4Sandboxed(jupyter.SandboxConfig{}))
		s := probe(t, g)
		if s.GWEnviron.OK && s.GWEnviron.SHA == hex.EncodeToString(ownSum[:]) {
			t.Errorf("sandboxed kernel reads the gateway's /proc/%d/environ", os.Getpid())
		}
		if s.GWEnviron.Token || s.GWEnviron.Marker || s.GWCmdline.Token {
			t.Errorf("sandboxed kernel finds gateway secrets in /proc")
		}
		t.Logf("sandboxed: /proc/%d/environ: ok=%v err=%s", os.Getpid(), s.GWEnviron.OK, s.GWEnviron.Err)
	})
}

// ---------------------------------------------------------------------------
// 14-15: ids and other principals.

// B4 #14: "Kernel id: non-UUID, uppercase, v1 UUID, duplicate, other
// tenant's id" → "400/409/404; never another tenant's data".
//
// A client-chosen kernel_id must be a canonical (lowercase, hyphenated) v4
// UUID. A duplicate returns the existing kernel, as jupyter_server does
// (no second process). There are no tenants: every credential sees every
// kernel (context tokens are case 15). TestBadRequests covers "../x".
func TestB4_14_KernelIDs(t *testing.T) {
	g := newGateway(t)
	v4 := uuid.NewString()
	v1, _ := uuid.NewUUID()
	for _, id := range []string{
		"not-a-uuid", "../x", strings.Repeat("a", 10<<10),
		strings.ToUpper(uuid.NewString()),
		"{" + uuid.NewString() + "}",
		"urn:uuid:" + uuid.NewString(),
		strings.ReplaceAll(uuid.NewString(), "-", ""),
		v1.String(),
		uuid.Nil.String(),
	} {
		short := id
		if len(short) > 48 {
			short = short[:48] + "…"
		}
		status, body := g.do("POST", "/api/kernels", map[string]any{"kernel_id": id})
		if status == http.StatusCreated {
			k := decode[sessions.KernelModel](t, body)
			g.do("DELETE", "/api/kernels/"+url.PathEscape(k.ID), nil)
			t.Errorf("kernel_id %q: 201 with id %q; want 400 (only canonical lowercase v4 UUIDs)", short, k.ID)
		} else if status != http.StatusBadRequest {
			t.Errorf("kernel_id %q: %d %.200s, want 400", short, status, body)
		}
	}
	status, body := g.do("POST", "/api/kernels", map[string]any{"kernel_id": v4})
	if status != http.StatusCreated || decode[sessions.KernelModel](t, body).ID != v4 {
		t.Fatalf("canonical kernel_id: %d %s", status, body)
	}
	kk, _ := g.mgr.Kernel(v4)
	pid := kk.PID()
	status, body = g.do("POST", "/api/kernels", map[string]any{"kernel_id": v4})
	switch {
	case status == http.StatusConflict:
	case status == http.StatusCreated && decode[sessions.KernelModel](t, body).ID == v4:
	default:
		t.Errorf("duplicate kernel_id: %d %s, want the same kernel or 409", status, body)
	}
	if n := len(g.mgr.Kernels()); n != 1 || kk.PID() != pid {
		t.Errorf("duplicate kernel_id: %d kernels, pid %d → %d", n, pid, kk.PID())
	}
	// Lookups: only the exact id.
	for _, id := range []string{strings.ToUpper(v4), "{" + v4 + "}", strings.ReplaceAll(v4, "-", ""), v4 + "%2f..", "..%2f" + v4, uuid.NewString(), strings.Repeat("a", 10<<10)} {
		resp, _ := b4Raw(t, g, "GET", "/api/kernels/"+id, map[string]string{"Authorization": "token " + testToken})
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET /api/kernels/%.48s: %d, want 404", id, resp.StatusCode)
		}
		if _, resp, err := g.dialURL(id, "", http.Header{"Authorization": {"token " + testToken}}); err == nil || resp == nil || resp.StatusCode != http.StatusNotFound {
			t.Errorf("websocket to %.48s: %v, want 404", id, err)
		}
	}
}

// B4 #15: "Tenant B: GET/DELETE/interrupt/restart/WS-connect A's kernel;
// GET /api/kernels" → "404 on each; list shows only own kernels".
//
// kernelgate has no tenants: the token and API keys see every kernel. The
// one narrower principal is a context token: it may use its context (and
// its kernel's websocket) and nothing else. TestContextTokens
// (scopes_test.go) covers contexts, runs, listing and websockets; this
// covers the Jupyter kernel routes of another context's kernel and checks
// that kernel kept its state. Refusals are 403 (the route is closed to
// context tokens), not 404.
func TestB4_15_ContextTokenOtherKernel(t *testing.T) {
	g := newGateway(t)
	b4Context(t, g, map[string]any{"id": "mine"})
	other := b4Context(t, g, map[string]any{"id": "theirs"})
	g.run(map[string]any{"code": "state = 'kept'", "context": "theirs"})
	status, body := g.do("POST", "/api/contexts/mine/tokens", map[string]any{"ttl": 60})
	if status != http.StatusCreated {
		t.Fatalf("mint: %d %s", status, body)
	}
	as := map[string]string{"Authorization": "Bearer " + decode[map[string]string](t, body)["token"]}
	kid := *other.KernelID
	for _, c := range []struct{ method, path string }{
		{"GET", "/api/kernels/" + kid},
		{"DELETE", "/api/kernels/" + kid},
		{"POST", "/api/kernels/" + kid + "/interrupt"},
		{"POST", "/api/kernels/" + kid + "/restart"},
		{"GET", "/api/kernels"},
		{"GET", "/api/sessions"},
		{"POST", "/api/sessions"},
		{"DELETE", "/api/contexts/theirs"},
		{"POST", "/api/contexts/theirs/interrupt"},
		{"POST", "/api/contexts/theirs/restart"},
		{"GET", "/api/status"},
		{"GET", "/metrics"},
	} {
		status, body := g.doWith(c.method, c.path, nil, as)
		if status != http.StatusForbidden && status != http.StatusNotFound {
			t.Errorf("%s %s with another context's token: %d %s, want 403/404", c.method, c.path, status, body)
		}
		if bytes.Contains(body, []byte("kept")) {
			t.Errorf("%s %s leaks the other context's data", c.method, c.path)
		}
	}
	if _, resp, err := g.dial(kid, "", false, http.Header{"Authorization": {as["Authorization"]}}); err == nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("websocket of the other kernel: %v, want 403", err)
	}
	if e := g.run(map[string]any{"code": "state", "context": "theirs"}); b4Result(e) != "'kept'" {
		t.Errorf("the other context lost its state: %+v", e)
	}
}

// ---------------------------------------------------------------------------
// 16-20: transport and messages.

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

// B4 #16: "100 MiB request body; slow-loris headers; 10 000 idle WS
// connections" → "413 without full buffering; header/read timeouts;
// per-principal connection cap".
//
// TestExecuteErrorCodes covers a 17 MiB body. Here: 100 MiB bodies on both
// surfaces are answered 413 while the client is still sending, and the
// gateway's memory does not grow by them; headers sent slowly are cut by
// ReadHeaderTimeout; websockets that stop answering pings are closed.
// Not covered because kernelgate has no such limit: a per-principal cap on
// connections, and a timeout on slowly sent bodies (http.Server has no
// ReadTimeout): see docs/security.md.
func TestB4_16_BodySizeAndSlowClients(t *testing.T) {
	g := newGateway(t, func(_ *sessions.Config, c *Config) { c.PingInterval = 250 * time.Millisecond })
	t.Run("100 MiB bodies", func(t *testing.T) {
		for _, c := range []struct {
			path    string
			chunked bool
		}{{"/api/execute", false}, {"/api/execute", true}, {"/api/kernels", false}, {"/api/contexts", true}} {
			// What the process allocated meanwhile (the gateway reads up to
			// its 16 MiB limit; this client has one 1 MiB chunk) stays under
			// the body's size.
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			status, sent := b4SendBody(t, g, c.path, 100<<20, c.chunked)
			runtime.ReadMemStats(&after)
			if status != http.StatusRequestEntityTooLarge {
				t.Errorf("POST %s (chunked %v) with 100 MiB: %d, want 413", c.path, c.chunked, status)
			}
			if sent >= 100<<20 {
				t.Errorf("POST %s (chunked %v): the answer came after the whole body was sent", c.path, c.chunked)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc >= 100<<20 {
				t.Errorf("POST %s (chunked %v): %d MiB allocated while refusing it", c.path, c.chunked, alloc>>20)
			}
			t.Logf("POST %s (chunked %v): 413 after %d MiB sent, %d MiB allocated", c.path, c.chunked, sent>>20, (after.TotalAlloc-before.TotalAlloc)>>20)
		}
		if n := len(g.mgr.Kernels()); n != 0 {
			t.Errorf("%d kernels started", n)
		}
	})
	t.Run("slow headers", func(t *testing.T) {
		if got := g.srv.http.ReadHeaderTimeout; got != 10*time.Second {
			t.Errorf("ReadHeaderTimeout %v, want 10s", got)
		}
		if g.srv.http.IdleTimeout <= 0 {
			t.Errorf("no IdleTimeout")
		}
		if g.srv.http.ReadTimeout == 0 {
			t.Logf("note: no ReadTimeout: a client that sends a body slowly holds its connection (see docs/security.md)")
		}
		// The server enforces it (lowered so the test need not wait 10 s).
		g.srv.http.ReadHeaderTimeout = 300 * time.Millisecond
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go g.srv.Serve(l)
		conn, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		io.WriteString(conn, "GET /api HTTP/1.1\r\nHost: x\r\nX-Slow: ")
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		t0 := time.Now()
		_, err = io.Copy(io.Discard, conn)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("a connection with unfinished headers was not closed within 10 s")
		}
		t.Logf("unfinished headers: connection closed after %v", time.Since(t0).Round(time.Millisecond))
	})
	t.Run("idle websockets", func(t *testing.T) {
		k := g.startKernel("python3")
		kk, _ := g.mgr.Kernel(k.ID)
		live := g.mustDial(k.ID, true) // reads, so it answers pings
		// A client that never reads never answers a ping.
		mute, _, err := g.dialURL(k.ID, "?session_id=mute", http.Header{"Authorization": {"token " + testToken}})
		if err != nil {
			t.Fatal(err)
		}
		defer mute.Close()
		eventually(t, 5*time.Second, func() bool { return kk.Model().Connections == 1 })
		mute.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			if _, _, err := mute.ReadMessage(); err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					t.Fatalf("the mute websocket is still open")
				}
				break
			}
		}
		if got := b4WSResult(t, live, "6*7"); got != "42" {
			t.Errorf("the live websocket after many ping intervals: %q", got)
		}
	})
}

// B4 #17: "50 MiB WS frame / execute code" → "close 1009 or 413; kernel
// unaffected".
//
// With Config.MaxFrameBytes 1 MiB, a 2 MiB frame closes the websocket with
// 1009 (message too big) and the kernel still answers; frames under the
// limit pass. TestExecuteErrorCodes covers a 17 MiB body (413); here 50 MiB
// of code.
func TestB4_17_LargeFrame(t *testing.T) {
	g := newGateway(t, func(_ *sessions.Config, c *Config) { c.MaxFrameBytes = 1 << 20 })
	k := g.startKernel("python3")
	// Under the limit: runs.
	c := g.mustDial(k.ID, false)
	if got := b4WSResult(t, c, "#"+strings.Repeat("x", 900<<10)+"\n6*7"); got != "42" {
		t.Fatalf("a 900 KiB frame: %q", got)
	}
	conn, _, err := g.dialURL(k.ID, "?session_id=big", http.Header{"Authorization": {"token " + testToken}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	frame := b4ExecuteFrame("shell", "big", uuid.NewString(), "big = 1 #"+strings.Repeat("x", 2<<20))
	// The gateway may close while the frame is still being written: the
	// write's error does not matter, the close code does.
	go conn.WriteMessage(websocket.TextMessage, frame)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, _, err := conn.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.CloseMessageTooBig {
			t.Fatalf("after a 2 MiB frame: %v, want close 1009", err)
		}
		break
	}
	// The kernel is unaffected and never saw the frame.
	c2 := g.mustDial(k.ID, true)
	if got := b4WSResult(t, c2, "'big' in globals(), 6*7"); got != "(False, 42)" {
		t.Errorf("kernel after the oversized frame: %q", got)
	}
	if status, _ := b4SendBody(t, g, "/api/execute", 50<<20, false); status != http.StatusRequestEntityTooLarge {
		t.Errorf("50 MiB of code: %d, want 413", status)
	}
}

// B4 #18: "WS message not JSON / missing header / channel iopub,hb,../x /
// disallowed msg_type / forged header.session" → "dropped with error; never
// forwarded; connection policy documented".
//
// Policy: malformed frames and frames for any channel but shell, control
// and stdin are dropped (logged at debug) and the connection stays open.
// There is no msg_type allow-list: a client with the exec scope may send
// any request on shell or control. header.session is the client's and is
// forwarded as is; replies are routed by msg_id to the connection that sent
// the request, never by header.session.
func TestB4_18_MalformedWebsocketMessages(t *testing.T) {
	g := newGateway(t)
	k := g.startKernel("python3")
	victim := b4Dial(t, g, k.ID, "victim", true)
	conn, _, err := g.dialURL(k.ID, "?session_id=attacker", http.Header{"Authorization": {"token " + testToken}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw := func(mt int, b []byte) {
		t.Helper()
		if err := conn.WriteMessage(mt, b); err != nil {
			t.Fatalf("the connection was closed: %v", err)
		}
	}
	raw(websocket.TextMessage, []byte("not json"))
	raw(websocket.TextMessage, []byte(`{"channel":"shell"}`))
	raw(websocket.TextMessage, []byte(`{"channel":"shell","header":{"msg_type":"execute_request"},"content":{"code":"no_id = 1"}}`))
	raw(websocket.TextMessage, []byte(`{"channel":"shell","header":"x","content":{"code":"bad_header = 1"}}`))
	raw(websocket.TextMessage, []byte(`{"channel":"shell","header":{"msg_id":"x","msg_type":"execute_request"},"content":"not an object"}`))
	raw(websocket.TextMessage, []byte(strings.Repeat("[", 100000)))
	raw(websocket.BinaryMessage, []byte{0, 0, 0, 9, 0, 0, 0, 1})
	raw(websocket.BinaryMessage, []byte{0xff, 0xff, 0xff, 0xff})
	for ch, name := range map[string]string{"iopub": "forged_iopub", "hb": "forged_hb", "../x": "forged_x", "SHELL": "forged_upper", "shell\x00": "forged_nul", "stdin/../shell": "forged_path"} {
		raw(websocket.TextMessage, b4ExecuteFrame(ch, "attacker", uuid.NewString(), name+" = 1"))
	}
	// v1 framing: bad offsets and a foreign channel.
	victimConn := victim.conn
	victimConn.WriteMessage(websocket.BinaryMessage, []byte{7, 0, 0, 0, 0, 0, 0, 0, 255, 255})
	m, _ := jupyter.NewMessage("victim", jupyter.ExecuteRequest, jupyter.NewExecute("forged_v1_iopub = 1"), nil)
	var buf bytes.Buffer
	writeV1(&buf, "iopub", m)
	victimConn.WriteMessage(websocket.BinaryMessage, buf.Bytes())
	victim.run("'frames before this one were handled'")
	// An unknown request type is forwarded; the kernel ignores it.
	raw(websocket.TextMessage, []byte(`{"channel":"shell","header":{"msg_id":"`+uuid.NewString()+`","msg_type":"evil_request","session":"attacker","username":"x","version":"5.3"},"parent_header":{},"metadata":{},"content":{}}`))

	// A forged header.session: forwarded, but the reply goes to the sender.
	forged := uuid.NewString()
	raw(websocket.TextMessage, b4ExecuteFrame("shell", "victim", forged, "forged_session = 1"))
	attacker := &wsClient{t: t, conn: conn, session: "attacker", msgs: make(chan wsMsg, 1000)}
	go attacker.read()
	attacker.until(10*time.Second, func(m wsMsg) bool {
		return m.Channel == "shell" && m.Header.MsgType == jupyter.ExecuteReply && m.ParentHeader.MsgID == forged
	})
	got := b4WSResult(t, attacker, "sorted(n for n in ('no_id', 'bad_header', 'forged_iopub', 'forged_hb', 'forged_x', 'forged_upper', 'forged_nul', 'forged_path', 'forged_v1_iopub', 'forged_session') if n in globals())")
	if got != "['forged_session']" {
		t.Errorf("names defined by dropped messages: %s, want only ['forged_session']", got)
	}
	// The victim's connection works and never got the forged request's reply.
	own := victim.execute("6*7", false)
	for _, m := range victim.until(10*time.Second, func(m wsMsg) bool { return m.Channel == "shell" && m.ParentHeader.MsgID == own }) {
		if m.Channel == "shell" && m.ParentHeader.MsgID == forged {
			t.Errorf("the reply to a request with a forged header.session went to the session it named")
		}
	}
}

// B4 #19: "Fetch connection info / HMAC key via API, errors or logs" →
// "never exposed; gateway re-signs all messages".
//
// Everything a session produced (REST answers, errors, metrics, the
// OpenAPI document, raw websocket frames, streamed events and debug logs)
// is searched for the keys of every kernel, read from their connection
// files.
func TestB4_19_HMACKeyNeverExposed(t *testing.T) {
	var logs lockedBuffer
	g := newGateway(t, b4Logs(&logs))
	k := g.startKernel("python3")
	b4Context(t, g, map[string]any{"id": "ctx"})
	var haystack bytes.Buffer
	add := func(b []byte) { haystack.Write(b); haystack.WriteByte('\n') }

	// Websocket traffic, raw frames, both framings.
	for _, proto := range [][]string{nil, {v1Protocol}} {
		d := websocket.Dialer{Subprotocols: proto}
		u := "ws" + strings.TrimPrefix(g.url, "http") + "/api/kernels/" + k.ID + "/channels?session_id=s"
		conn, _, err := d.Dial(u, http.Header{"Authorization": {"token " + testToken}})
		if err != nil {
			t.Fatal(err)
		}
		id := uuid.NewString()
		frame := b4ExecuteFrame("shell", "s", id, "print('hello'); 1/0")
		if len(proto) > 0 {
			m, _ := jupyter.NewMessage("s", jupyter.ExecuteRequest, jupyter.NewExecute("print('hello'); 1/0"), nil)
			id = m.Header.MsgID
			var b bytes.Buffer
			writeV1(&b, "shell", m)
			conn.WriteMessage(websocket.BinaryMessage, b.Bytes())
		} else {
			conn.WriteMessage(websocket.TextMessage, frame)
		}
		info, _ := jupyter.NewMessage("s", jupyter.KernelInfoRequest, map[string]any{}, nil)
		if len(proto) > 0 {
			var b bytes.Buffer
			writeV1(&b, "shell", info)
			conn.WriteMessage(websocket.BinaryMessage, b.Bytes())
		} else {
			conn.WriteMessage(websocket.TextMessage, appendLegacyJSON(nil, "shell", info, true))
		}
		conn.SetReadDeadline(time.Now().Add(15 * time.Second))
		gotReply, gotInfo := false, false
		for !gotReply || !gotInfo {
			_, data, err := conn.ReadMessage()
			if err != nil {
				t.Fatalf("websocket: %v", err)
			}
			add(data)
			gotReply = gotReply || (bytes.Contains(data, []byte(`"execute_reply"`)) && bytes.Contains(data, []byte(id)))
			gotInfo = gotInfo || bytes.Contains(data, []byte(`"kernel_info_reply"`))
		}
		conn.Close()
	}
	var needles []string
	collect := func() {
		for _, kern := range g.mgr.Kernels() {
			path, ci := b4ConnFile(t, kern.PID())
			if ci.Key == "" {
				t.Fatalf("no key in %s", path)
			}
			needles = append(needles, ci.Key, path, filepath.Base(path))
		}
	}
	collect()
	// REST, both surfaces, successes and errors.
	e := g.run(map[string]any{"code": "import os; print(sorted(os.environ)); 1/0", "context": "ctx"})
	iso := g.run(map[string]any{"code": "print('iso')", "isolated": true})
	for _, p := range []string{
		"/api", "/api/status", "/api/kernelspecs", "/api/kernelspecs/python3", "/api/kernels", "/api/kernels/" + k.ID,
		"/api/sessions", "/api/contexts", "/api/contexts/ctx", "/api/runs/" + e.ID, "/api/runs/" + e.ID + "/events",
		"/api/runs/" + iso.ID, "/metrics", "/api/openapi.json", "/api/kernels/" + uuid.NewString(), "/api/contexts/nope",
		"/kernelspecs/python3/kernel.json",
	} {
		_, body := g.do("GET", p, nil)
		add(body)
	}
	for _, c := range []struct{ path, body string }{
		{"/api/kernels/" + k.ID + "/restart", ""}, {"/api/kernels", `{"name":"nope"}`}, {"/api/execute", `{"code":`},
		{"/api/execute", `{"code":"1","context":"nope"}`}, {"/api/kernels/" + k.ID + "/interrupt", ""},
	} {
		_, body := g.do("POST", c.path, c.body)
		add(body)
	}
	add([]byte(logs.String()))

	collect()
	for _, needle := range needles {
		if bytes.Contains(haystack.Bytes(), []byte(needle)) {
			t.Errorf("%q appears in what the gateway answered or logged", needle)
		}
	}
	if len(needles) < 3*3 || haystack.Len() < 10000 {
		t.Fatalf("checked %d needles against %d bytes", len(needles), haystack.Len())
	}
}

// B4 #20: "Two tenants' kernels and two sessions on one kernel" → "no
// cross-kernel iopub leakage; per-session routing by parent_header per
// policy".
//
// Policy, as jupyter_server: iopub of a kernel goes to every websocket of
// that kernel; a reply (shell, control) and stdin requests go only to the
// websocket whose request they answer. A client reusing the msg_id of
// another client's pending request must not take its reply.
func TestB4_20_NoCrossTalk(t *testing.T) {
	g := newGateway(t)
	k1 := g.startKernel("python3")
	k2 := g.startKernel("python3")
	a := b4Dial(t, g, k1.ID, "session-a", true)
	b := b4Dial(t, g, k1.ID, "session-b", false)
	other := b4Dial(t, g, k2.ID, "session-other", true)
	// requestDone waits for the reply and idle status of request id.
	requestDone := func(c *wsClient, id string) []wsMsg {
		reply, idle := false, false
		return c.until(15*time.Second, func(m wsMsg) bool {
			if m.ParentHeader.MsgID == id {
				reply = reply || (m.Channel == "shell" && m.Header.MsgType == jupyter.ExecuteReply)
				idle = idle || m.state() == "idle"
			}
			return reply && idle
		})
	}

	id := a.execute("print('k1-secret-output')", false)
	requestDone(a, id)
	// Once a has its reply, anything misrouted is already queued ahead of
	// what b and other receive next.
	seenB := b.until(10*time.Second, func(m wsMsg) bool { return m.ParentHeader.MsgID == id && m.state() == "idle" })
	seenB = append(seenB, requestDone(b, b.execute("'own request'", false))...)
	seenOther := requestDone(other, other.execute("'probe'", false))
	stream := false
	for _, m := range seenB {
		stream = stream || strings.Contains(m.text(t), "k1-secret-output")
		if m.ParentHeader.MsgID == id && m.Channel != "iopub" {
			t.Errorf("the second session got %s %s of another connection's request", m.Channel, m.Header.MsgType)
		}
	}
	if !stream {
		t.Errorf("the second session on the kernel did not get the kernel's iopub")
	}
	for _, m := range seenOther {
		if m.ParentHeader.MsgID == id || strings.Contains(m.text(t), "k1-secret-output") {
			t.Errorf("a client of another kernel got %s %s of kernel 1", m.Channel, m.Header.MsgType)
		}
	}

	t.Run("reused msg_id", func(t *testing.T) {
		id := a.execute("import time; time.sleep(1); 'a-result'", false)
		a.until(10*time.Second, func(m wsMsg) bool { return m.Header.MsgType == jupyter.ExecuteInput && m.ParentHeader.MsgID == id })
		// b sends a request under a's msg_id while a's is pending.
		if err := b.conn.WriteMessage(websocket.TextMessage, b4ExecuteFrame("shell", "session-b", id, "'b-result'")); err != nil {
			t.Fatal(err)
		}
		deadline := time.NewTimer(6 * time.Second)
		defer deadline.Stop()
		for {
			select {
			case m := <-a.msgs:
				if m.Channel == "shell" && m.ParentHeader.MsgID == id {
					return
				}
			case <-deadline.C:
				t.Fatalf("a's request never got its reply: another connection that reused its msg_id took it")
			}
		}
	})
}

// ---------------------------------------------------------------------------
// 21-25: resources and isolation of kernels.

// b4ForkBomb starts processes until the system refuses one, then kills
// and reaps them and re-raises the failure. It spawns sleep (vfork and
// exec) rather than forking Python, so the processes hit the pids limit
// long before their copied memory would hit the memory limit.
const b4ForkBomb = `
import subprocess
procs = []
try:
    for i in range(500):
        procs.append(subprocess.Popen(['sleep', '30']))
finally:
    for p in procs:
        p.kill()
        p.wait()
`

// B4 #21: "Code: fork bomb, 10 GB allocation, fill /tmp, CPU spin, 1e7
// threads/fds" → "kernel hits pids/memory/disk/cpu limits → error or kernel
// death reported; gateway and other kernels unaffected".
//
// jupyter.TestMemoryLimitKillsKernel, TestPidsLimitStopsForkBomb and
// TestRlimits cover the limits on one kernel. Here, through /api/execute:
// a 1 GiB allocation in a context limited to 256 MiB ends its run "lost"
// while a run on another context completes and the gateway's memory stays
// flat; a fork bomb fails with BlockingIOError under the pids limit; too
// many files fail with EMFILE under RLIMIT_NOFILE; in the sandbox, filling
// /tmp (a tmpfs charged to the kernel's memory) kills only that kernel.
// CPU is not limited (no cpu controller is used) and disk writes outside
// the sandbox's /tmp are not bounded: see docs/security.md.
func TestB4_21_ResourceLimits(t *testing.T) {
	limits := jupyter.Limits{MemoryBytes: 256 << 20, Pids: 64, NoFile: 256}
	g := newGateway(t, func(m *sessions.Config, _ *Config) { m.KernelLimits = limits })
	hog := b4Context(t, g, map[string]any{"id": "hog"})
	b4NeedCgroup(t, *hog.KernelProcessID)
	b4Context(t, g, map[string]any{"id": "calm"})
	g.run(map[string]any{"code": "kept = 'calm'", "context": "calm"})

	runtime.GC()
	before := rssBytes(t)
	resp := startStream(t, g, map[string]any{"code": "import time\ntime.sleep(0.5)\nx = bytearray(1 << 30)", "context": "hog"})
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	first := readEvents(t, sc, func(e event) bool { return e.Type == "start" })
	eventually(t, 10*time.Second, func() bool {
		return decode[sessions.RunModel](t, mustGet(t, g, "/api/runs/"+first[0].Run)).State != sessions.RunQueued
	})
	// A run queued behind the allocation is the next run after the death:
	// it must start a fresh kernel ("lost ... the next run starts a kernel
	// without the earlier state").
	queued := make(chan sessions.Execution, 1)
	go func() {
		var e sessions.Execution
		defer func() { queued <- e }()
		req, _ := http.NewRequest("POST", g.url+"/api/execute", strings.NewReader(`{"code":"6*7","context":"hog"}`))
		req.Header.Set("Authorization", "token "+testToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("queued run: %v", err)
			return
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("queued run: %d %v", resp.StatusCode, err)
		}
	}()
	if e := g.run(map[string]any{"code": "sum(range(10**6)), kept", "context": "calm"}); b4Result(e) != "(499999500000, 'calm')" {
		t.Errorf("run on another context during the allocation: %+v", e)
	}
	evs := readEvents(t, sc, func(e event) bool { return e.Type == "end" })
	if end := evs[len(evs)-1]; end.Type != "end" || end.Process.Reason != sessions.Lost || end.Process.ExitCode != nil || !strings.Contains(end.Process.Message, "out of memory") {
		t.Errorf("1 GiB in 256 MiB: %s, want lost, out of memory", end.Raw)
	}
	if grew := rssBytes(t) - before; grew > 64<<20 {
		t.Errorf("gateway RSS grew by %d MiB", grew>>20)
	}
	if e := g.run(map[string]any{"code": "kept", "context": "calm"}); b4Result(e) != "'calm'" {
		t.Errorf("the other context after the OOM: %+v", e)
	}
	if next := <-queued; next.Process.Reason != sessions.Completed || b4Result(next) != "42" {
		t.Errorf("the run queued behind the one that killed the kernel: %s, want completed on a fresh kernel (runs sent before the gateway has cleaned up the dead process end lost without running)", next.Process.Reason)
		eventually(t, 15*time.Second, func() bool {
			return !decode[sessions.ContextModel](t, mustGet(t, g, "/api/contexts/hog")).Active
		})
	}

	e := g.run(map[string]any{"code": b4ForkBomb, "context": "hog"})
	if e.Error == nil || e.Error.Name != "BlockingIOError" || e.Process.Reason != sessions.Errored {
		t.Errorf("fork bomb under pids 64: %+v, want BlockingIOError", e)
	}
	e = g.run(map[string]any{"code": "fds = []\ntry:\n    while len(fds) < 100000:\n        fds.append(open('/dev/null'))\nfinally:\n    n = len(fds)\n    [f.close() for f in fds]", "context": "hog"})
	if e.Error == nil || !strings.Contains(e.Error.Value, "Too many open files") {
		t.Errorf("100 000 files under nofile 256: %+v, want EMFILE", e.Error)
	}
	if e := g.run(map[string]any{"code": "n < 256, 6*7", "context": "hog"}); b4Result(e) != "(True, 42)" {
		t.Errorf("kernel after fork bomb and files: %+v", e)
	}

	t.Run("fill /tmp in the sandbox", func(t *testing.T) {
		b4NeedSandbox(t)
		g := newGateway(t, b4Sandboxed(jupyter.SandboxConfig{}), func(m *sessions.Config, _ *Config) { m.KernelLimits = limits })
		b4Context(t, g, map[string]any{"id": "filler"})
		b4Context(t, g, map[string]any{"id": "bystander"})
		e := g.run(map[string]any{"code": "import os\nwith open('/tmp/fill', 'wb') as f:\n    for i in range(1024):\n        f.write(b'x' * (1 << 20))", "context": "filler"})
		if e.Process.Reason != sessions.Lost && (e.Error == nil || !strings.Contains(e.Error.Value, "No space")) {
			t.Errorf("1 GiB into the sandbox's /tmp under 256 MiB: %+v %+v, want lost (OOM) or ENOSPC", e.Process, e.Error)
		}
		t.Logf("filling /tmp: run ended %s", e.Process.Reason)
		if e := g.run(map[string]any{"code": "6*7", "context": "bystander"}); b4Result(e) != "42" {
			t.Errorf("other kernel: %+v", e)
		}
	})
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
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
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

// B4 #22: "1 000 parallel POST /api/kernels" → "capped at limit (403/429),
// pending counted, no orphan processes/pods".
//
// TestMaxKernelsUnderConcurrentStarts covers 20 starts. Here 100 (CI time)
// against MaxKernels 3, with a pids limit as by default (so each kernel has
// a cgroup), one kernel leaving a child in a session of its own (out of
// its process group); after the kernels are deleted no process of theirs
// is left. Then the same escape from a kernel without cgroup limits.
func TestB4_22_ParallelStartsNoOrphans(t *testing.T) {
	const max, n = 3, 100
	childrenBefore := len(b4Children())
	g := newGateway(t, func(m *sessions.Config, _ *Config) {
		m.MaxKernels = max
		m.KernelLimits = jupyter.Limits{Pids: 256}
	})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	var ids []string
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, body := g.do("POST", "/api/kernels", map[string]string{"name": "python3"})
			mu.Lock()
			defer mu.Unlock()
			codes[status]++
			if status == http.StatusCreated {
				var k sessions.KernelModel
				json.Unmarshal(body, &k)
				ids = append(ids, k.ID)
			}
		}()
	}
	wg.Wait()
	if codes[http.StatusCreated] != max || codes[http.StatusTooManyRequests] != n-max {
		t.Fatalf("status counts %v, want %d×201 and %d×429", codes, max, n-max)
	}
	kk, _ := g.mgr.Kernel(ids[0])
	b4NeedCgroup(t, kk.PID())
	connFile, _ := b4ConnFile(t, kk.PID())
	runtimeDir := filepath.Dir(filepath.Dir(filepath.Dir(connFile)))
	escaped := b4Escape(t, g.mustDial(ids[0], true))
	if len(b4Procs(runtimeDir)) < max+1 {
		t.Fatalf("kernel processes not found under %s", runtimeDir)
	}
	for _, id := range ids {
		if status, _ := g.do("DELETE", "/api/kernels/"+id, nil); status != http.StatusNoContent {
			t.Errorf("DELETE %s: %d", id, status)
		}
	}
	if left := b4Leftovers(runtimeDir, 10*time.Second); len(left) > 0 {
		t.Errorf("processes left after deleting every kernel: %v (the escaped child is %d)", left, escaped)
	}
	eventually(t, 10*time.Second, func() bool { return len(b4Children()) <= childrenBefore })
	if n := len(g.mgr.Kernels()); n != 0 {
		t.Errorf("%d kernels left", n)
	}

	t.Run("without cgroup limits", func(t *testing.T) {
		g := newGateway(t)
		k := g.startKernel("python3")
		kk, _ := g.mgr.Kernel(k.ID)
		connFile, _ := b4ConnFile(t, kk.PID())
		runtimeDir := filepath.Dir(filepath.Dir(filepath.Dir(connFile)))
		escaped := b4Escape(t, g.mustDial(k.ID, true))
		if status, _ := g.do("DELETE", "/api/kernels/"+k.ID, nil); status != http.StatusNoContent {
			t.Fatalf("DELETE: %d", status)
		}
		if left := b4Leftovers(runtimeDir, 5*time.Second); len(left) > 0 {
			t.Errorf("a child that left the kernel's process group survives the kernel's deletion: %v (escaped %d); without a cgroup only the process group is killed", left, escaped)
		}
	})
}

// b4Connect is Python code that tries to open TCP connections with a 2 s
// timeout and prints, as JSON, how each attempt ended and how long it took.
const b4Connect = `
import json, socket, time
out = {}
for name, host, port in TARGETS:
    t0 = time.time()
    try:
        socket.create_connection((host, port), timeout=2).close()
        r = 'connected'
    except OSError as e:
        r = type(e).__name__ + ':' + str(e.errno)
    out[name] = [r, round(time.time() - t0, 3)]
print(json.dumps(out))
`

// B4 #23: "Kernel egress to 169.254.169.254, kube-apiserver, gateway admin
// port, other kernels' ZMQ ports" → "blocked (netns/NetworkPolicy)".
//
// With the sandbox and its network off, a kernel has only its own
// loopback: the gateway's port, another kernel's ports, the host's
// addresses and the metadata address all fail at once (refused or
// unreachable, never a hang). jupyter.TestSandboxedPython/Deno "no
// network" cover a host loopback port. Without the sandbox, or with
// --sandbox-network, nothing is blocked (docs/security.md).
func TestB4_23_Egress(t *testing.T) {
	b4NeedSandbox(t)
	g := newGateway(t, b4Sandboxed(jupyter.SandboxConfig{}))
	a := b4Context(t, g, map[string]any{"id": "a"})
	b := b4Context(t, g, map[string]any{"id": "b"})
	_, ciB := b4ConnFile(t, *b.KernelProcessID)
	gw, _ := strconv.Atoi(b4Port(g))
	targets := [][3]any{
		{"gateway", "127.0.0.1", gw},
		{"kernel b shell", "127.0.0.1", ciB.ShellPort},
		{"kernel b control", "127.0.0.1", ciB.ControlPort},
		{"metadata", "169.254.169.254", 80},
		{"kube-apiserver", "10.96.0.1", 443},
		{"public", "1.1.1.1", 443},
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, ad := range addrs {
			if ip, ok := ad.(*net.IPNet); ok && ip.IP.To4() != nil && !ip.IP.IsLoopback() {
				targets = append(targets, [3]any{"host " + ip.IP.String(), ip.IP.String(), gw})
				break
			}
		}
	}
	js, _ := json.Marshal(targets)
	var got map[string][2]any
	b4JSON(t, g, "a", "TARGETS = "+string(js)+"\n"+b4Connect, &got)
	for name, r := range got {
		outcome, _ := r[0].(string)
		took, _ := r[1].(float64)
		if outcome == "connected" {
			t.Errorf("sandboxed kernel connected to %s", name)
		}
		if strings.HasPrefix(outcome, "timeout") || strings.HasPrefix(outcome, "TimeoutError") || took > 1.5 {
			t.Errorf("%s: %s after %.2fs, want a fast failure", name, outcome, took)
		}
	}
	t.Logf("from sandboxed kernel %s: %v", *a.KernelID, got)
}

// B4 #24: "Kernel A reads kernel B's connection file or sends
// unsigned/forged messages to B's ports" → "permission denied; B rejects
// bad signatures".
//
// Sandboxed, the runtime directory is hidden, so A cannot open B's
// connection file. To test the signature check alone, the sandbox's network
// is on here (A can reach B's ports): A sends B execute_requests with no
// signature and with a signature of a wrong key (B ignores both), then one
// signed with B's real key, which the test reads on the host (B runs it:
// the channel works, only the signature stood in the way).
func TestB4_24_CrossKernelZMQ(t *testing.T) {
	b4NeedSandbox(t)
	g := newGateway(t, b4Sandboxed(jupyter.SandboxConfig{Network: true}))
	b4Context(t, g, map[string]any{"id": "a"})
	b := b4Context(t, g, map[string]any{"id": "b"})
	g.run(map[string]any{"code": "state = 'b'", "context": "b"})
	pathB, ciB := b4ConnFile(t, *b.KernelProcessID)
	code := fmt.Sprintf(`
import hashlib, hmac, json, os, uuid, datetime
PATH, PORT, KEY = %q, %d, %q
out = {}
try:
    open(PATH).read()
    out['read'] = 'read'
except OSError as e:
    out['read'] = type(e).__name__
import zmq
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0)
s.connect('tcp://127.0.0.1:%%d' %% PORT)
def send(code, key):
    header = json.dumps({'msg_id': str(uuid.uuid4()), 'msg_type': 'execute_request', 'session': 'forger',
                         'username': 'forger', 'date': datetime.datetime.utcnow().isoformat() + 'Z', 'version': '5.3'}).encode()
    parts = [header, b'{}', b'{}', json.dumps({'code': code, 'silent': False, 'store_history': False,
             'user_expressions': {}, 'allow_stdin': False, 'stop_on_error': False}).encode()]
    sig = hmac.new(key.encode(), b''.join(parts), hashlib.sha256).hexdigest().encode() if key else b''
    s.send_multipart([b'<IDS|MSG>', sig] + parts)
send("unsigned = 1", None)
send("wrong_key = 1", "not-the-key")
send("signed = 1", KEY)
out['reply'] = bool(s.poll(10000))
print(json.dumps(out))
`, pathB, ciB.ShellPort, ciB.Key)
	var got struct {
		Read  string `json:"read"`
		Reply bool   `json:"reply"`
	}
	b4JSON(t, g, "a", code, &got)
	if got.Read == "read" {
		t.Errorf("kernel a read kernel b's connection file %s", pathB)
	}
	if !got.Reply {
		t.Fatalf("the correctly signed request got no reply: the test did not reach kernel b")
	}
	if e := g.run(map[string]any{"code": "sorted(n for n in ('unsigned', 'wrong_key', 'signed') if n in globals()), state", "context": "b"}); b4Result(e) != "(['signed'], 'b')" {
		t.Errorf("kernel b after forged messages: %s, want (['signed'], 'b')", b4Result(e))
	}
}

// B4 #25: "Kernel reads gateway config/token files or writes into another
// kernel's cwd" → "denied (uid + mount ns)".
//
// The sandbox binds / read-only: what hides a file is its place (/tmp,
// /var/tmp and the runtime directory are always hidden) or SandboxConfig.Hide.
// A kernel runs as uid 0 without capabilities, so a root-owned 0600 file
// outside those places is readable (the test logs it; the cause is case
// 28's). Writes into another context's working directory never reach it:
// the host is read-only and the other directory is not bound writable.
// jupyter.TestSandboxedPython covers hidden paths and read-only writes.
func TestB4_25_GatewayFilesAndOtherCwd(t *testing.T) {
	b4NeedSandbox(t)
	conf := b4HostDir(t)
	hidden := filepath.Join(conf, "hidden")
	os.Mkdir(hidden, 0o700)
	const secret = "kg-b4-key-secret-0123456789"
	os.WriteFile(filepath.Join(hidden, "api-keys"), []byte("agent exec "+secret+"\n"), 0o600)
	os.WriteFile(filepath.Join(conf, "unlisted-keys"), []byte("agent exec "+secret+"\n"), 0o600)
	// Each context gets a workspace of its own below the root, given to
	// the sandbox user (nobody).
	root := b4HostDir(t)
	g := newGateway(t, b4Sandboxed(jupyter.SandboxConfig{Hide: []string{hidden}}), func(m *sessions.Config, _ *Config) { m.Workspaces = mustRoot(t, root) })
	ws := filepath.Join(root, "contexts")
	b4Context(t, g, map[string]any{"id": "a"})
	b4Context(t, g, map[string]any{"id": "b"})
	g.run(map[string]any{"code": "open('mine.txt', 'w').write('b')", "context": "b"})

	code := fmt.Sprintf(`
import json, os
HIDDEN, UNLISTED, OTHER = %q, %q, %q
def read(p):
    try:
        return open(p).read()
    except OSError as e:
        return type(e).__name__
def write(p):
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, 'w') as f:
            f.write('from a')
        return 'written'
    except OSError as e:
        return type(e).__name__
print(json.dumps({
    'hidden': read(HIDDEN), 'hidden_dir': os.listdir(os.path.dirname(HIDDEN)) if os.path.isdir(os.path.dirname(HIDDEN)) else None,
    'unlisted': read(UNLISTED),
    'other_read': read(os.path.join(OTHER, 'mine.txt')),
    'other_write': write(os.path.join(OTHER, 'from-a.txt')),
    'root_write': write(os.path.join(os.path.dirname(OTHER), 'from-a.txt')),
}))
`, filepath.Join(hidden, "api-keys"), filepath.Join(conf, "unlisted-keys"), filepath.Join(ws, "b"))
	var got map[string]any
	b4JSON(t, g, "a", code, &got)
	if s, _ := got["hidden"].(string); strings.Contains(s, secret) {
		t.Errorf("sandboxed kernel read a hidden keys file")
	}
	if got["other_write"] == "written" || got["root_write"] == "written" {
		t.Logf("writes in a's view: %v, %v", got["other_write"], got["root_write"])
	}
	for _, p := range []string{filepath.Join(ws, "b", "from-a.txt"), filepath.Join(ws, "from-a.txt")} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("kernel a wrote %s on the host", p)
		}
	}
	if e := g.run(map[string]any{"code": "import os; sorted(f for f in os.listdir('.') if not f.startswith('.'))", "context": "b"}); b4Result(e) != "['mine.txt']" {
		t.Errorf("b's working directory: %s", b4Result(e))
	}
	if s, _ := got["unlisted"].(string); strings.Contains(s, secret) {
		t.Logf("as uid 0 without capabilities, a sandboxed kernel reads a root-owned 0600 file outside the hidden paths (%s): list the gateway's configuration in SandboxConfig.Hide", filepath.Join(conf, "unlisted-keys"))
	}
	t.Logf("reading another context's working directory outside /tmp: %v (the host is bound read-only)", got["other_read"])
}

// ---------------------------------------------------------------------------
// 26-30: outputs, redirects, Deno, startup files, stdin.

// B4 #26: "Outputs with text/html/application/javascript/SVG <script>" →
// "returned as data with application/json + nosniff; never rendered on API
// origin (nbconvert XSS advisory, CVE-2019-9644)".
//
// The API returns outputs inside JSON (Content-Type application/json or
// application/x-ndjson, X-Content-Type-Options: nosniff); no route serves
// an output as a document. The browser front-end, on the same origin,
// sends a Content Security Policy without inline scripts and renders HTML
// outputs in sandboxed iframes (web/README.md, web/e2e).
func TestB4_26_OutputsAreData(t *testing.T) {
	g := newGateway(t, func(_ *sessions.Config, c *Config) { c.Web = web.Handler() })
	code := `from IPython.display import display, HTML, Javascript
display(HTML('<script>alert("html")</script><img src=x onerror=alert(1)>'))
display(Javascript('alert("js")'))
display({'image/svg+xml': '<svg xmlns="http://www.w3.org/2000/svg"><script>alert("svg")</script></svg>'}, raw=True)
HTML('<script>alert("main")</script>')`
	req, _ := http.NewRequest("POST", g.url+"/api/execute", strings.NewReader(`{"code":`+strconv.Quote(code)+`}`))
	req.Header.Set("Authorization", "token "+testToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	check := func(what string, h http.Header, wantType string) {
		if ct := h.Get("Content-Type"); !strings.HasPrefix(ct, wantType) {
			t.Errorf("%s: Content-Type %q, want %s", what, ct, wantType)
		}
		if h.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: no X-Content-Type-Options: nosniff", what)
		}
	}
	check("POST /api/execute", resp.Header, "application/json")
	e := decode[sessions.Execution](t, body)
	var html, js, svg, main bool
	for _, r := range e.Results {
		html = html || strings.Contains(r.HTML, `<script>alert("html")</script>`)
		var jsData string
		json.Unmarshal(r.Data["application/javascript"], &jsData)
		js = js || strings.Contains(jsData, `alert("js")`) || strings.Contains(r.JavaScript, `alert("js")`)
		svg = svg || strings.Contains(r.SVG, `<script>alert("svg")</script>`)
		main = main || (r.IsMainResult && strings.Contains(r.HTML, "main"))
	}
	if !html || !js || !svg || !main {
		t.Errorf("outputs not returned as data (html %v, javascript %v, svg %v, main %v): %s", html, js, svg, main, body)
	}
	// The raw body is JSON: the markup is inside strings, never at top level.
	if bytes.HasPrefix(bytes.TrimSpace(body), []byte("<")) {
		t.Errorf("body starts as markup")
	}
	// Streams and run records.
	sresp := startStream(t, g, map[string]any{"code": code})
	io.Copy(io.Discard, sresp.Body)
	sresp.Body.Close()
	check("streamed run", sresp.Header, "application/x-ndjson")
	for _, p := range []string{"/api/runs/" + e.ID, "/api/runs/" + e.ID + "/events"} {
		req, _ := http.NewRequest("GET", g.url+p, nil)
		req.Header.Set("Authorization", "token "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		want := "application/json"
		if strings.HasSuffix(p, "/events") {
			want = "application/x-ndjson"
		}
		check("GET "+p, resp.Header, want)
	}
	// Errors too.
	resp, errBody := b4Raw(t, g, "GET", "/api/runs/%3Cscript%3E", map[string]string{"Authorization": "token " + testToken})
	check("error", resp.Header, "application/json")
	if bytes.Contains(errBody, []byte("<script>")) {
		t.Logf("note: the error body reflects markup (harmless as application/json with nosniff): %s", errBody)
	}
	// The front-end page forbids inline scripts and framing.
	resp, _ = b4Raw(t, g, "GET", "/", nil)
	csp := resp.Header.Get("Content-Security-Policy")
	for _, d := range []string{"script-src 'self'", "object-src 'none'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, d) {
			t.Errorf("front-end CSP %q lacks %q", csp, d)
		}
	}
}

// B4 #27: "Any redirect parameter next=//evil.com, /\evil.com,
// https:evil.com" → "rejected (CVE-2020-26232, CVE-2023-39968)".
//
// kernelgate has no login page and no redirect parameter: no route answers
// 3xx, whatever the path or query (a trailing slash is routed, not
// redirected).
func TestB4_27_NoRedirects(t *testing.T) {
	g := newGateway(t, func(_ *sessions.Config, c *Config) { c.Web = web.Handler() })
	targets := []string{
		"/api/kernels?next=//evil.com", "/api/kernels/?next=//evil.com", "/api/kernelspecs?next=https:evil.com",
		"/?next=//evil.com", "/?next=/%5Cevil.com", "/index.html", "/index.html?next=//evil.com", "/static", "/static/",
		"/static/../", "/login?next=//evil.com", "/login?next=https:evil.com", "/logout?next=//evil.com",
		"/tree?next=//evil.com", "/api/", "/api/kernels/", "/api/contexts/", "/kernelspecs/python3/",
		"//evil.com", "//evil.com/", "/\\evil.com", "/%2F%2Fevil.com", "/%5Cevil.com", "///evil.com",
		"/api/kernels/..", "/api/kernels/../..", "/./api/kernels", "/api//kernels",
	}
	for _, target := range targets {
		for _, hdr := range []map[string]string{nil, {"Authorization": "token " + testToken}} {
			resp, _ := b4Raw(t, g, "GET", target, hdr)
			if resp.StatusCode >= 300 && resp.StatusCode < 400 {
				t.Errorf("GET %s: %d to %q", target, resp.StatusCode, resp.Header.Get("Location"))
			}
			if loc := resp.Header.Get("Location"); loc != "" {
				t.Errorf("GET %s: Location %q", target, loc)
			}
		}
	}
}

// B4 #28: "Deno cell: Deno.readTextFile("/etc/shadow"), new
// Deno.Command("sh"), fetch metadata IP" → "governed by OS sandbox (Deno
// kernel is --allow-all, deno#25692) → denied/blocked".
//
// Deno's permissions are not a boundary (the kernel runs with
// --allow-all): only the sandbox is. A subprocess runs but is confined
// (read-only host, own PID namespace); fetch to the metadata address fails
// at once with the network off. /etc/shadow: the sandbox runs as uid 0
// without capabilities, and the file is root's, so its owner bits let uid 0
// read it unless the sandbox hides it; the test requires that it is not
// readable.
func TestB4_28_DenoSandbox(t *testing.T) {
	b4NeedSandbox(t)
	g := newGateway(t, b4Sandboxed(jupyter.SandboxConfig{}))
	b4Context(t, g, map[string]any{"id": "deno", "language": "javascript"})
	run := func(code string) string {
		t.Helper()
		e := g.run(map[string]any{"code": code, "context": "deno"})
		if e.Error != nil {
			t.Fatalf("%s: %s %s", code, e.Error.Name, e.Error.Value)
		}
		return b4Result(e)
	}
	t.Run("/etc/shadow", func(t *testing.T) {
		if _, err := os.Stat("/etc/shadow"); err != nil {
			t.Skip("no /etc/shadow here")
		}
		got := run(`let r; try { r = "read " + Deno.readTextFileSync("/etc/shadow").length + " bytes" } catch (e) { r = e.name }; r`)
		if strings.HasPrefix(got, `"read`) {
			t.Errorf("a sandboxed Deno kernel reads /etc/shadow: %s (uid 0 without capabilities still owns root's files: run kernels as an unprivileged uid or hide such files)", got)
		}
	})
	t.Run("subprocess", func(t *testing.T) {
		got := run(fmt.Sprintf(`const o = new Deno.Command("sh", {args: ["-c", "touch /usr/kg-b4 2>/dev/null && echo wrote || echo read-only; test -e /proc/%d && echo sees-gateway || echo no-gateway; ls /proc | grep -c '^[0-9]'"]}).outputSync(); new TextDecoder().decode(o.stdout).trim().split("\n").join(" ")`, os.Getpid()))
		f := strings.Fields(strings.Trim(got, `"`))
		if len(f) != 3 || f[0] != "read-only" || f[1] != "no-gateway" {
			t.Errorf("sh from Deno: %s, want read-only, no-gateway", got)
		}
		if n, _ := strconv.Atoi(f[len(f)-1]); n > 10 {
			t.Errorf("sh from Deno sees %d processes", n)
		}
	})
	t.Run("fetch metadata", func(t *testing.T) {
		got := run(`const t0 = Date.now(); let r; try { r = "status-" + (await fetch("http://169.254.169.254/latest/meta-data/", {signal: AbortSignal.timeout(2000)})).status } catch (e) { r = e.name }; r + " " + (Date.now() - t0)`)
		var outcome string
		var ms float64
		if _, err := fmt.Sscanf(strings.Trim(got, `"'`), "%s %g", &outcome, &ms); err != nil {
			t.Fatalf("fetch: %s: %v", got, err)
		}
		if strings.HasPrefix(outcome, "status") || outcome == "TimeoutError" || ms > 1500 {
			t.Errorf("fetch of the metadata address from a sandboxed Deno kernel: %s after %.0f ms, want a fast failure", outcome, ms)
		}
	})
}

// b4PlantProbe reads the marks the planted files would set.
const b4PlantProbe = "import os; [os.environ.get(k) for k in ('KG_IPYCFG', 'KG_IPYKCFG', 'KG_STARTUP', 'KG_PTH', 'KG_USERCUSTOM', 'KG_JCFG', 'KG_LAUNCHER')]"

// b4Plant writes startup and configuration files into HOME and the working
// directory that, if obeyed, set marks in the environment.
const b4Plant = `
import os, site, sys
home, cwd = os.environ['HOME'], os.getcwd()
def put(p, s):
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, 'w') as f:
        f.write(s)
cfg = "c.InteractiveShellApp.exec_lines = ['import os; os.environ[\"%s\"] = \"ran\"']\n"
for d in (cwd, os.path.join(os.environ.get('IPYTHONDIR', home + '/.ipython'), 'profile_default')):
    put(os.path.join(d, 'ipython_config.py'), cfg % 'KG_IPYCFG')
    put(os.path.join(d, 'ipython_kernel_config.py'), cfg % 'KG_IPYKCFG')
put(os.path.join(os.environ.get('IPYTHONDIR', home + '/.ipython'), 'profile_default', 'startup', '00-kg.py'), "import os; os.environ['KG_STARTUP'] = 'ran'\n")
usersite = site.getusersitepackages()
put(os.path.join(usersite, 'kg.pth'), "import os; os.environ['KG_PTH'] = 'ran'\n")
put(os.path.join(usersite, 'usercustomize.py'), "import os; os.environ['KG_USERCUSTOM'] = 'ran'\n")
for d in (cwd, os.environ.get('JUPYTER_CONFIG_DIR', home + '/.jupyter')):
    for n in ('jupyter_config.py', 'jupyter_kernel_config.py', 'jupyter_server_config.py'):
        put(os.path.join(d, n), "import os; os.environ['KG_JCFG'] = 'ran'\n")
put(os.path.join(cwd, 'ipykernel_launcher.py'), '''import os, sys
os.environ["KG_LAUNCHER"] = "ran"
cwd = os.getcwd()
sys.path[:] = [p for p in sys.path if p not in ("", cwd)]
from ipykernel import kernelapp as app
app.launch_new_instance()
''')
print('planted')
`

// B4 #29: "Cell writes ipython_config.py, .pth, deno.json,
// jupyter_*_config.py into cwd/HOME, then restart kernel" → "restarted
// kernel does not execute/obey them (fresh gateway-owned dir;
// CVE-2022-21699/39286, deno PR #35587)".
//
// Every launch gets fresh HOME, IPython, Jupyter and working directories,
// so a restarted context starts clean. A working directory the caller
// chose (inside --workspace-root) persists across restarts: files planted
// there must not be obeyed at the next start either. ipykernel is started
// as "python -m ipykernel_launcher", which puts the working directory first
// on sys.path (a planted ipykernel_launcher.py would run instead of the
// real one), and Deno reads deno.json from its working directory.
func TestB4_29_StartupFilesIgnoredAfterRestart(t *testing.T) {
	g := newGateway(t)
	for _, c := range []struct{ name, cwd string }{{"fresh dirs", ""}, {"caller's cwd", "proj"}} {
		t.Run(c.name, func(t *testing.T) {
			id := strings.ReplaceAll(c.name, " ", "-")
			id = strings.ReplaceAll(id, "'", "")
			body := map[string]any{"id": id}
			if c.cwd != "" {
				body["cwd"] = c.cwd
			}
			b4Context(t, g, body)
			if e := g.run(map[string]any{"code": b4Plant, "context": id}); strings.TrimSpace(b4Stdout(e)) != "planted" {
				t.Fatalf("planting: %+v", e)
			}
			status, out := g.do("POST", "/api/contexts/"+id+"/restart", nil)
			if status != http.StatusOK {
				t.Fatalf("restart: %d %s", status, out)
			}
			e := g.run(map[string]any{"code": b4PlantProbe, "context": id})
			if got := b4Result(e); got != "[None, None, None, None, None, None, None]" {
				t.Errorf("restarted kernel obeyed planted files (ipython_config, ipython_kernel_config, startup, .pth, usercustomize, jupyter config, ipykernel_launcher.py): %s", got)
			}
		})
	}
	for _, c := range []struct{ name, cwd string }{{"deno.json, fresh dirs", ""}, {"deno.json, caller's cwd", "deno"}} {
		t.Run(c.name, func(t *testing.T) {
			id := "deno-" + strconv.Itoa(len(c.cwd))
			body := map[string]any{"id": id, "language": "typescript"}
			if c.cwd != "" {
				body["cwd"] = c.cwd
			}
			b4Context(t, g, body)
			plant := `Deno.writeTextFileSync("deno.json", JSON.stringify({imports: {"kgprobe": "./probe.js"}}));
Deno.writeTextFileSync("probe.js", "export default 'planted';");
1`
			if e := g.run(map[string]any{"code": plant, "context": id, "language": "typescript"}); e.Error != nil {
				t.Fatalf("planting: %+v", e.Error)
			}
			if status, out := g.do("POST", "/api/contexts/"+id+"/restart", nil); status != http.StatusOK {
				t.Fatalf("restart: %d %s", status, out)
			}
			e := g.run(map[string]any{"code": `let r; try { r = (await import("kgprobe")).default } catch (e) { r = "not resolved" }; r`, "context": id, "language": "typescript"})
			if got := b4Result(e); got != `"not resolved"` {
				t.Errorf("restarted Deno kernel resolved an import through a planted deno.json: %s", got)
			}
		})
	}
}

// B4 #30: "input() with allow_stdin=false; pending input_request then
// shutdown/interrupt" → "StdinNotImplementedError; shutdown/interrupt not
// blocked".
//
// TestExecuteSeeds ("input without stdin fails fast") covers /api/execute
// without stdin; this adds the websocket with allow_stdin false, and runs
// blocked in input() (streamed with stdin: true, and over the websocket)
// that are interrupted, and whose context or kernel is deleted.
func TestB4_30_StdinNeverBlocks(t *testing.T) {
	g := newGateway(t)
	b4Context(t, g, map[string]any{"id": "stdin"})

	t.Run("websocket without stdin", func(t *testing.T) {
		k := g.startKernel("python3")
		c := g.mustDial(k.ID, true)
		reply, _ := c.run("input('name? ')")
		var r struct {
			Status, Ename string
		}
		decodeInto(t, reply.Content, &r)
		if r.Status != "error" || r.Ename != "StdinNotImplementedError" {
			t.Errorf("input() with allow_stdin false: %+v", r)
		}
	})

	awaitInput := func(t *testing.T) (*http.Response, *bufio.Scanner, string) {
		resp := startStream(t, g, map[string]any{"code": "input('waiting? ')", "context": "stdin", "stdin": true})
		sc := bufio.NewScanner(resp.Body)
		evs := readEvents(t, sc, func(e event) bool { return e.Type == "input_request" })
		if last := evs[len(evs)-1]; last.Type != "input_request" {
			t.Fatalf("no input_request: %s", last.Raw)
		}
		return resp, sc, evs[0].Run
	}
	t.Run("interrupt while waiting", func(t *testing.T) {
		resp, sc, run := awaitInput(t)
		defer resp.Body.Close()
		t0 := time.Now()
		if status, _ := g.do("POST", "/api/runs/"+run+"/interrupt", nil); status != http.StatusNoContent {
			t.Fatalf("interrupt: %d", status)
		}
		evs := readEvents(t, sc, func(e event) bool { return e.Type == "end" })
		end := evs[len(evs)-1]
		if end.Type != "end" || end.Process.Reason != sessions.Interrupted || time.Since(t0) > 5*time.Second {
			t.Errorf("end %s after %v, want interrupted", end.Raw, time.Since(t0))
		}
		if e := g.run(map[string]any{"code": "6*7", "context": "stdin"}); b4Result(e) != "42" {
			t.Errorf("next run: %+v", e)
		}
	})
	t.Run("delete the context while waiting", func(t *testing.T) {
		resp, sc, _ := awaitInput(t)
		defer resp.Body.Close()
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "DELETE", g.url+"/api/contexts/stdin", nil)
		req.Header.Set("Authorization", "token "+testToken)
		dresp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("DELETE while input() waits: %v", err)
		}
		dresp.Body.Close()
		if dresp.StatusCode != http.StatusNoContent || time.Since(t0) > 5*time.Second {
			t.Errorf("DELETE: %d after %v", dresp.StatusCode, time.Since(t0))
		}
		evs := readEvents(t, sc, func(e event) bool { return e.Type == "end" })
		if end := evs[len(evs)-1]; end.Type != "end" || end.Process.Reason != sessions.Lost {
			t.Errorf("the waiting run ended with %s, want lost", end.Raw)
		}
	})
	t.Run("delete the kernel while a websocket waits", func(t *testing.T) {
		k := g.startKernel("python3")
		c := g.mustDial(k.ID, true)
		c.execute("input('waiting? ')", true)
		c.until(10*time.Second, func(m wsMsg) bool { return m.Header.MsgType == jupyter.InputRequest })
		t0 := time.Now()
		if status, _ := g.do("DELETE", "/api/kernels/"+k.ID, nil); status != http.StatusNoContent || time.Since(t0) > 5*time.Second {
			t.Errorf("DELETE: %d after %v", status, time.Since(t0))
		}
		deadline := time.NewTimer(5 * time.Second)
		defer deadline.Stop()
		for {
			select {
			case _, ok := <-c.msgs:
				if !ok {
					return
				}
			case <-deadline.C:
				t.Fatalf("the websocket stayed open after its kernel was deleted")
			}
		}
	})
}

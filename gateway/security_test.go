package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"kernelgate/internal/sysproc"
	"kernelgate/sessions"
)

func TestAuthOnEveryRoute(t *testing.T) {
	g := newGateway(t)
	k := g.startKernel("python3")
	routes := []struct{ method, path string }{
		{"GET", "/api/status"},
		{"GET", "/api/kernelspecs"},
		{"GET", "/api/kernelspecs/python3"},
		{"GET", "/kernelspecs/python3/logo-64x64.png"},
		{"GET", "/api/kernels"},
		{"POST", "/api/kernels"},
		{"GET", "/api/kernels/" + k.ID},
		{"DELETE", "/api/kernels/" + k.ID},
		{"POST", "/api/kernels/" + k.ID + "/interrupt"},
		{"POST", "/api/kernels/" + k.ID + "/restart"},
		{"GET", "/api/sessions"},
		{"POST", "/api/sessions"},
		{"GET", "/api/sessions/" + uuid.NewString()},
		{"PATCH", "/api/sessions/" + uuid.NewString()},
		{"DELETE", "/api/sessions/" + uuid.NewString()},
	}
	creds := []struct {
		name    string
		headers map[string]string
	}{
		{"missing", nil},
		{"wrong token", map[string]string{"Authorization": "token nope"}},
		{"wrong bearer", map[string]string{"Authorization": "Bearer " + testToken + "x"}},
		{"other scheme", map[string]string{"Authorization": "Basic " + testToken}},
	}
	for _, r := range routes {
		for _, c := range creds {
			status, body := g.doWith(r.method, r.path, nil, c.headers)
			if status != http.StatusUnauthorized {
				t.Errorf("%s %s (%s): %d %s, want 401", r.method, r.path, c.name, status, body)
			}
		}
	}
	// Query tokens are for websockets only, not for the REST API.
	if status, _ := g.doWith("GET", "/api/kernels?token="+testToken, nil, nil); status != http.StatusUnauthorized {
		t.Errorf("?token= on REST: %d, want 401", status)
	}
	// Both header schemes work.
	for _, h := range []string{"token " + testToken, "Bearer " + testToken, "bearer " + testToken} {
		if status, _ := g.doWith("GET", "/api/kernels", nil, map[string]string{"Authorization": h}); status != 200 {
			t.Errorf("Authorization %q: %d", h, status)
		}
	}
	// The websocket upgrade: no token 401, wrong 401, ?token= accepted.
	for _, hdr := range []http.Header{{}, {"Authorization": {"token nope"}}} {
		_, resp, err := g.dial(k.ID, "", false, hdr)
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("upgrade with %v: err %v, want 401", hdr, err)
		}
	}
	c, _, err := g.dialURL(k.ID, "?token="+testToken, nil)
	if err != nil {
		t.Fatalf("upgrade with ?token=: %v", err)
	}
	c.Close()
}

func TestOriginCheck(t *testing.T) {
	g := newGateway(t, func(_ *sessions.Config, c *Config) { c.AllowOrigins = []string{"https://lab.example.com"} })
	k := g.startKernel("python3")
	auth := http.Header{"Authorization": {"token " + testToken}}
	for _, tc := range []struct {
		origin string
		ok     bool
	}{
		{"", true},
		{"https://lab.example.com", true},
		{"https://evil.example.com", false},
		{"https://lab.example.com.evil.com", false},
		{"null", false},
	} {
		h := auth.Clone()
		if tc.origin != "" {
			h.Set("Origin", tc.origin)
		}
		c, resp, err := g.dial(k.ID, "", false, h)
		if tc.ok {
			if err != nil {
				t.Errorf("origin %q refused: %v", tc.origin, err)
			} else {
				c.conn.Close()
			}
			continue
		}
		if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Errorf("origin %q: err %v, want 403 before the upgrade", tc.origin, err)
		}
	}
	// Same host as the gateway is allowed.
	h := auth.Clone()
	h.Set("Origin", g.url)
	if c, _, err := g.dial(k.ID, "", false, h); err != nil {
		t.Errorf("own origin refused: %v", err)
	} else {
		c.conn.Close()
	}
	// CORS headers only for listed origins.
	status, _ := g.doWith("OPTIONS", "/api/kernels", nil, map[string]string{"Origin": "https://lab.example.com", "Access-Control-Request-Method": "POST"})
	if status != http.StatusNoContent {
		t.Errorf("preflight: %d", status)
	}
}

func TestBadRequests(t *testing.T) {
	g := newGateway(t)
	cases := []struct {
		name, method, path string
		body               any
		status             int
	}{
		{"unknown kernel", "GET", "/api/kernels/" + uuid.NewString(), nil, 404},
		{"unknown kernel delete", "DELETE", "/api/kernels/" + uuid.NewString(), nil, 404},
		{"unknown kernel interrupt", "POST", "/api/kernels/" + uuid.NewString() + "/interrupt", nil, 404},
		{"unknown kernel restart", "POST", "/api/kernels/" + uuid.NewString() + "/restart", nil, 404},
		{"malformed JSON", "POST", "/api/kernels", "{name: python3", 400},
		{"malformed session JSON", "POST", "/api/sessions", "[", 400},
		{"env not strings", "POST", "/api/kernels", `{"name":"python3","env":{"KERNEL_X":1}}`, 400},
		{"env newline", "POST", "/api/kernels", `{"name":"python3","env":{"KERNEL_X":"a\nb"}}`, 400},
		{"bad kernel id", "POST", "/api/kernels", `{"kernel_id":"../x"}`, 400},
		{"unknown kernelspec", "POST", "/api/kernels", `{"name":"cobol"}`, 400},
		{"unknown kernelspec model", "GET", "/api/kernelspecs/cobol", nil, 404},
		{"session without path", "POST", "/api/sessions", `{"type":"notebook"}`, 400},
		{"unknown route", "GET", "/api/nothing", nil, 404},
		{"traversal", "GET", "/kernelspecs/python3/../../etc/passwd", nil, 404},
		{"encoded traversal", "GET", "/kernelspecs/python3/..%2f..%2f..%2fetc%2fpasswd", nil, 404},
		{"double encoded", "GET", "/kernelspecs/python3/%252e%252e/kernel.json", nil, 404},
		{"dot segments", "GET", "/kernelspecs/python3/%2e%2e/%2e%2e/etc/passwd", nil, 404},
		{"absolute", "GET", "/kernelspecs/python3//etc/passwd", nil, 404},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := g.do(c.method, c.path, c.body)
			if status != c.status {
				t.Fatalf("%d %s, want %d", status, body, c.status)
			}
			m := decode[map[string]any](t, body)
			if msg, _ := m["message"].(string); msg == "" {
				t.Errorf("no message in %s", body)
			}
			if strings.Contains(string(body), "root:") {
				t.Errorf("leaked a file: %s", body)
			}
		})
	}
	if status, body := g.do("GET", "/kernelspecs/python3/kernel.json", nil); status != 200 || !strings.Contains(string(body), "ipykernel") {
		t.Errorf("a real resource: %d", status)
	}
}

func TestKernelEnvAllowList(t *testing.T) {
	g := newGateway(t, func(m *sessions.Config, _ *Config) { m.EnvAllow = []string{"EXTRA_OK"} })
	dir := t.TempDir()
	status, body := g.do("POST", "/api/kernels", map[string]any{"name": "python3", "env": map[string]string{
		"KERNEL_USERNAME": "ada", "EXTRA_OK": "yes", "LD_PRELOAD": "/tmp/x.so", "PATH": "/evil", "SECRET": "s", "KERNEL_WORKING_DIR": dir,
	}})
	if status != 201 {
		t.Fatalf("%d %s", status, body)
	}
	k := decode[sessions.KernelModel](t, body)
	c := g.mustDial(k.ID, true)
	_, iopub := c.run("import os; (os.environ.get('KERNEL_USERNAME'), os.environ.get('EXTRA_OK'), os.environ.get('LD_PRELOAD'), os.environ.get('SECRET'), os.environ['PATH'] == '/evil', os.getcwd())")
	want := fmt.Sprintf("('ada', 'yes', None, None, False, '%s')", dir)
	if got := resultText(t, iopub); got != want {
		t.Errorf("kernel sees %s, want %s", got, want)
	}
}

func TestMaxKernelsUnderConcurrentStarts(t *testing.T) {
	const max = 3
	g := newGateway(t, func(m *sessions.Config, _ *Config) { m.MaxKernels = max })
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, body, err := g.send("POST", "/api/kernels", map[string]string{"name": "python3"}, g.auth())
			if err != nil {
				t.Errorf("POST /api/kernels: %v %s", err, body)
			}
			mu.Lock()
			codes[status]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if codes[201] != max || codes[429] != 20-max {
		t.Errorf("status counts %v, want %d×201 and %d×429", codes, max, 20-max)
	}
	if n := len(g.mgr.Kernels()); n != max {
		t.Errorf("%d kernels alive, want %d", n, max)
	}
}

func TestKilledKernelRestarts(t *testing.T) {
	g := newGateway(t)
	k := g.startKernel("python3")
	c := g.mustDial(k.ID, true)
	c.run("x = 1")
	kk, _ := g.mgr.Kernel(k.ID)
	if err := sysproc.Kill(kk.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	got := c.until(10*time.Second, func(m wsMsg) bool { return m.state() == "restarting" })
	if last := got[len(got)-1]; last.Channel != "iopub" || last.ParentHeader.MsgID != "" {
		t.Errorf("restarting status on %s with parent %q", last.Channel, last.ParentHeader.MsgID)
	}
	// The kernel comes back, without the old state.
	c.until(30*time.Second, func(m wsMsg) bool { return m.state() == "idle" })
	if _, iopub := c.run("1+1"); resultText(t, iopub) != "2" {
		t.Errorf("restarted kernel does not answer")
	}
	reply, _ := c.run("x")
	var r struct {
		Status, Ename string
	}
	decodeInto(t, reply.Content, &r)
	if r.Status != "error" || r.Ename != "NameError" {
		t.Errorf("after restart: %+v, want NameError", r)
	}
	if st := kk.Model().ExecutionState; st != "idle" {
		t.Errorf("state %q", st)
	}
}

func TestCulling(t *testing.T) {
	g := newGateway(t, func(m *sessions.Config, _ *Config) {
		m.CullIdleTimeout = 300 * time.Millisecond
		m.CullInterval = 50 * time.Millisecond
	})
	idle := g.startKernel("python3")
	connected := g.startKernel("python3")
	c := g.mustDial(connected.ID, true)
	eventually(t, 10*time.Second, func() bool {
		status, _ := g.do("GET", "/api/kernels/"+idle.ID, nil)
		return status == 404
	})
	// A kernel with a client is not culled by default.
	if status, _ := g.do("GET", "/api/kernels/"+connected.ID, nil); status != 200 {
		t.Errorf("connected kernel culled: %d", status)
	}
	c.conn.Close()
	eventually(t, 10*time.Second, func() bool {
		status, _ := g.do("GET", "/api/kernels/"+connected.ID, nil)
		return status == 404
	})
}

func TestSessionsCRUD(t *testing.T) {
	g := newGateway(t)
	status, body := g.do("POST", "/api/sessions", map[string]any{"path": "a.ipynb", "type": "notebook", "name": "a", "kernel": map[string]string{"name": "python3"}})
	if status != 201 {
		t.Fatalf("create: %d %s", status, body)
	}
	s := decode[sessions.SessionModel](t, body)
	if s.Kernel == nil || s.Kernel.Name != "python3" || s.Notebook == nil || s.Notebook.Path != "a.ipynb" {
		t.Fatalf("session %s", body)
	}
	// Same path: the same session.
	_, body = g.do("POST", "/api/sessions", map[string]any{"path": "a.ipynb", "type": "notebook"})
	if again := decode[sessions.SessionModel](t, body); again.ID != s.ID {
		t.Errorf("second create for the path made %s", again.ID)
	}
	// PATCH to a new kernel of another spec: the old kernel goes away.
	status, body = g.do("PATCH", "/api/sessions/"+s.ID, map[string]any{"path": "b.ipynb", "kernel": map[string]string{"name": "deno"}})
	if status != 200 {
		t.Fatalf("patch: %d %s", status, body)
	}
	p := decode[sessions.SessionModel](t, body)
	if p.Path != "b.ipynb" || p.Kernel.Name != "deno" || p.Kernel.ID == s.Kernel.ID {
		t.Errorf("patched %s", body)
	}
	if status, _ := g.do("GET", "/api/kernels/"+s.Kernel.ID, nil); status != 404 {
		t.Errorf("old kernel still there: %d", status)
	}
	status, body = g.do("GET", "/api/sessions", nil)
	if list := decode[[]sessions.SessionModel](t, body); len(list) != 1 {
		t.Errorf("list %s", body)
	}
	if status, _ = g.do("DELETE", "/api/sessions/"+s.ID, nil); status != 204 {
		t.Errorf("delete %d", status)
	}
	if status, _ = g.do("GET", "/api/kernels/"+p.Kernel.ID, nil); status != 404 {
		t.Errorf("kernel of deleted session: %d", status)
	}
	if status, _ = g.do("GET", "/api/sessions/"+s.ID, nil); status != 404 {
		t.Errorf("deleted session: %d", status)
	}
}

func TestJupyterBodiesContentType(t *testing.T) {
	g := newGateway(t)
	auth := func(ct string) map[string]string {
		return map[string]string{"Authorization": "token " + testToken, "Content-Type": ct}
	}
	// A page of another origin can post forms without a preflight: refused.
	for _, ct := range []string{"application/x-www-form-urlencoded", "multipart/form-data; boundary=x"} {
		if status, body := g.doWith("POST", "/api/kernels", "name=python3", auth(ct)); status != 415 {
			t.Errorf("%s: %d %s", ct, status, body)
		}
	}
	// @jupyterlab/services sends its JSON as text/plain.
	if status, body := g.doWith("POST", "/api/kernels", `{"name":"python3"}`, auth("text/plain;charset=UTF-8")); status != 201 {
		t.Errorf("text/plain JSON: %d %s", status, body)
	}
	// The code-interpreter API takes JSON only.
	if status, body := g.doWith("POST", "/api/execute", `{"code":"1"}`, auth("text/plain")); status != 415 {
		t.Errorf("text/plain on /api/execute: %d %s", status, body)
	}
}

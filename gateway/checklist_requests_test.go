package gateway

// The checklist, 4-8: what requests may carry (helpers in checklist_helpers_test.go).

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"kernelgate/sessions"
)

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
				t.Errorf("%s %s %q: the message names Go types: %s", r.method, r.path, short, body)
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

package gateway

// The checklist, 1-3: origins and credentials (helpers in checklist_helpers_test.go).

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"kernelgate/sessions"
)

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

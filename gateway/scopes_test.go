package gateway

import (
	"net/http"
	"testing"
	"time"

	"kernelgate/runs"
	"kernelgate/sessions"

	"kernelgate/internal/timefmt"
)

func mustKey(t *testing.T, line string) APIKey {
	t.Helper()
	k, err := ParseAPIKey(line)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestAPIKeyScopes(t *testing.T) {
	const readKey, execKey = "read-key-0123456789", "exec-key-0123456789"
	g := newGateway(t, func(_ *sessions.Config, c *Config) {
		c.APIKeys = []APIKey{mustKey(t, "reader read "+readKey), mustKey(t, "runner exec "+HashSecret(execKey))}
	})
	as := func(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }

	// read lists and gets, and cannot run code or open a kernel websocket.
	for _, path := range []string{"/api/kernels", "/api/kernelspecs", "/api/contexts", "/api/sessions", "/api/status"} {
		if status, body := g.doWith("GET", path, nil, as(readKey)); status != 200 {
			t.Errorf("read key GET %s: %d %s", path, status, body)
		}
	}
	status, body := g.doWith("POST", "/api/execute", map[string]string{"code": "1"}, as(readKey))
	if got := decode[map[string]any](t, body); status != 403 || got["code"] != "FORBIDDEN" {
		t.Errorf("read key execute: %d %s", status, body)
	}
	if status, _ := g.doWith("POST", "/api/kernels", map[string]string{}, as(readKey)); status != 403 {
		t.Errorf("read key starts a kernel: %d", status)
	}
	// exec runs code; the file may hold the key's hash instead of the secret.
	status, body = g.doWith("POST", "/api/execute", map[string]string{"code": "6*7"}, as(execKey))
	if e := decode[runs.Execution](t, body); status != 200 || len(e.Results) != 1 || e.Results[0].Text != "42" {
		t.Errorf("exec key execute: %d %s", status, body)
	}
	if status, _ := g.doWith("GET", "/api/contexts", nil, as(execKey)); status != 403 {
		t.Errorf("exec-only key lists contexts: %d, want 403", status)
	}
	k := g.startKernel("python3")
	if _, resp, err := g.dial(k.ID, "", false, http.Header{"Authorization": {"Bearer " + readKey}}); err == nil || resp.StatusCode != 403 {
		t.Errorf("read key opens a kernel websocket: %v", err)
	}
	if c, _, err := g.dial(k.ID, "", false, http.Header{"Authorization": {"Bearer " + execKey}}); err != nil {
		t.Errorf("exec key websocket: %v", err)
	} else {
		c.conn.Close()
	}
	if status, _ := g.doWith("GET", "/api/kernels", nil, as("unknown-key-0123456789")); status != 401 {
		t.Errorf("unknown key: %d", status)
	}
}

func TestContextTokens(t *testing.T) {
	g := newGateway(t)
	for _, id := range []string{"mine", "other"} {
		if status, body := g.do("POST", "/api/contexts", map[string]any{"id": id}); status != 201 {
			t.Fatalf("%d %s", status, body)
		}
	}
	status, body := g.do("POST", "/api/contexts/mine/tokens", map[string]any{"ttl": 60})
	if status != 201 {
		t.Fatalf("mint: %d %s", status, body)
	}
	tok := decode[map[string]string](t, body)
	if tok["token"] == "" {
		t.Fatalf("no token: %s", body)
	}
	if _, err := timefmt.Parse(tok["expiresAt"]); err != nil {
		t.Errorf("expiresAt %q: %v", tok["expiresAt"], err)
	}
	as := map[string]string{"Authorization": "Bearer " + tok["token"]}

	status, body = g.doWith("POST", "/api/execute", map[string]any{"code": "x = 5\nx * 2", "context": "mine"}, as)
	e := decode[runs.Execution](t, body)
	if status != 200 || len(e.Results) != 1 || e.Results[0].Text != "10" {
		t.Fatalf("execute in its context: %d %s", status, body)
	}
	if status, _ := g.doWith("GET", "/api/runs/"+e.ID, nil, as); status != 200 {
		t.Errorf("its run: %d", status)
	}
	if status, _ := g.doWith("GET", "/api/contexts/mine", nil, as); status != 200 {
		t.Errorf("its context: %d", status)
	}
	// Its kernel's websocket is open to it.
	ctx := decode[sessions.ContextModel](t, mustGet(t, g, "/api/contexts/mine"))
	if c, _, err := g.dial(*ctx.KernelID, "", false, http.Header{"Authorization": {"Bearer " + tok["token"]}}); err != nil {
		t.Errorf("websocket of its kernel: %v", err)
	} else {
		c.conn.Close()
	}
	other := decode[sessions.ContextModel](t, mustGet(t, g, "/api/contexts/other"))
	if _, resp, err := g.dial(*other.KernelID, "", false, http.Header{"Authorization": {"Bearer " + tok["token"]}}); err == nil || resp.StatusCode != 403 {
		t.Errorf("websocket of another kernel: %v", err)
	}
	// Everything else is forbidden.
	otherRun := g.run(map[string]any{"code": "1", "context": "other"})
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/api/execute", map[string]any{"code": "1", "context": "other"}},
		{"POST", "/api/execute", map[string]any{"code": "1"}},
		{"POST", "/api/execute", map[string]any{"code": "1", "isolated": true}},
		{"GET", "/api/contexts/other", nil},
		{"GET", "/api/runs/" + otherRun.ID, nil},
		{"GET", "/api/contexts", nil},
		{"GET", "/api/kernels", nil},
		{"DELETE", "/api/contexts/mine", nil},
		{"POST", "/api/contexts/mine/tokens", map[string]any{"ttl": 60}},
		{"POST", "/api/contexts", map[string]any{}},
	} {
		status, body := g.doWith(c.method, c.path, c.body, as)
		if got := decode[map[string]any](t, body); status != 403 || (got["code"] != nil && got["code"] != "FORBIDDEN") {
			t.Errorf("%s %s with a context token: %d %s, want 403", c.method, c.path, status, body)
		}
	}
	// After its TTL.
	_, body = g.do("POST", "/api/contexts/mine/tokens", map[string]any{"ttl": 0.2})
	short := decode[map[string]string](t, body)["token"]
	eventually(t, 5*time.Second, func() bool {
		status, _ := g.doWith("POST", "/api/execute", map[string]any{"code": "1", "context": "mine"}, map[string]string{"Authorization": "Bearer " + short})
		return status == 403
	})
	// Revoked with its context, even if one is made again under that id.
	g.do("DELETE", "/api/contexts/mine", nil)
	g.do("POST", "/api/contexts", map[string]any{"id": "mine"})
	if status, _ := g.doWith("POST", "/api/execute", map[string]any{"code": "1", "context": "mine"}, as); status != 403 && status != 401 {
		t.Errorf("token of a deleted context: %d", status)
	}
	if status, _ := g.do("POST", "/api/contexts/mine/tokens", map[string]any{"ttl": 1e9}); status != 400 {
		t.Errorf("ttl over the maximum: %d", status)
	}
}

package gateway

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kernelgate/sessions"
)

// e2bSandbox creates a sandbox over the E2B API and returns its id and
// access token.
func e2bSandbox(t *testing.T, g *testGateway, body string) (string, string) {
	t.Helper()
	status, out := g.doWith("POST", "/e2b/v2/sandboxes", body, map[string]string{"X-API-KEY": g.token})
	if status != http.StatusCreated {
		t.Fatalf("create sandbox: %d %s", status, out)
	}
	sb := decode[map[string]any](t, out)
	if sb["envdAccessToken"] != sb["trafficAccessToken"] || sb["envdVersion"] == "" {
		t.Fatalf("create answer = %s", out)
	}
	return sb["sandboxID"].(string), sb["envdAccessToken"].(string)
}

// sandboxContexts lists the ids of a sandbox's contexts on the API.
func sandboxContexts(t *testing.T, g *testGateway, id string) []string {
	t.Helper()
	var out []string
	for _, c := range g.mgr.Contexts() {
		if strings.HasPrefix(c.ID, "e2b-"+id+"-") {
			out = append(out, c.ID)
		}
	}
	return out
}

// checkFor calls ok until it holds or d has passed.
func checkFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(d)
	for !ok() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: not within %v", what, d)
		}
	}
}

func TestE2BEndpoint(t *testing.T) {
	g := newGateway(t)
	// No credentials, a wrong key, a context token: refused.
	if status, _ := g.doWith("POST", "/e2b/v2/sandboxes", "{}", nil); status != http.StatusUnauthorized {
		t.Fatalf("create without X-API-KEY: %d", status)
	}
	if status, _ := g.doWith("POST", "/e2b/v2/sandboxes", "{}", map[string]string{"X-API-KEY": "wrong-key-0123456789"}); status != http.StatusUnauthorized {
		t.Fatalf("create with a wrong key: %d", status)
	}
	id, tok := e2bSandbox(t, g, `{"templateID":"code-interpreter-v1"}`)
	sbx := func(extra map[string]string) map[string]string {
		h := map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": tok}
		for k, v := range extra {
			h[k] = v
		}
		return h
	}
	status, out := g.doWith("POST", "/e2b/execute", `{"code":"print('a')\n1/0"}`, sbx(nil))
	if status != http.StatusOK {
		t.Fatalf("execute: %d %s", status, out)
	}
	var types []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var ev map[string]any
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("not NDJSON: %q", line)
		}
		types = append(types, ev["type"].(string))
		if ev["type"] == "error" && (ev["name"] != "ZeroDivisionError" || !strings.Contains(ev["traceback"].(string), "ZeroDivisionError")) {
			t.Errorf("error line = %s", line)
		}
	}
	if got := strings.Join(types, ","); got != "stdout,error,number_of_executions,end_of_execution" {
		t.Fatalf("event types = %s", got)
	}
	// Another sandbox's token, no token, an unknown sandbox.
	_, other := e2bSandbox(t, g, `{}`)
	if status, _ := g.doWith("POST", "/e2b/execute", `{"code":"1"}`, sbx(map[string]string{"X-Access-Token": other})); status != http.StatusUnauthorized {
		t.Fatalf("execute with another sandbox's token: %d", status)
	}
	if status, _ := g.doWith("POST", "/e2b/execute", `{"code":"1"}`, map[string]string{"E2b-Sandbox-Id": "nope", "X-Access-Token": tok}); status != http.StatusBadGateway {
		t.Fatalf("execute in an unknown sandbox: %d", status)
	}
	// A sandbox's context is out of another sandbox's reach.
	if status, _ := g.doWith("POST", "/e2b/execute", `{"code":"1","context_id":"code-python"}`, sbx(nil)); status != http.StatusNotFound {
		t.Fatalf("execute in a context of no sandbox: %d", status)
	}

	// Kill: the contexts, their kernels and the workspace go.
	ctxs := sandboxContexts(t, g, id)
	if len(ctxs) != 1 {
		t.Fatalf("sandbox contexts = %v, want its python context", ctxs)
	}
	c, _ := g.mgr.Context(ctxs[0])
	kernel, dir := c.KernelID(), c.Workspace().Dir()
	if status, out := g.doWith("DELETE", "/e2b/sandboxes/"+id, nil, map[string]string{"X-API-KEY": g.token}); status != http.StatusNoContent {
		t.Fatalf("kill: %d %s", status, out)
	}
	if left := sandboxContexts(t, g, id); len(left) != 0 {
		t.Fatalf("contexts after kill: %v", left)
	}
	if _, err := g.mgr.Kernel(kernel); err == nil {
		t.Fatalf("kernel %s outlived its sandbox", kernel)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("workspace %s after kill: %v", dir, err)
	}
	if status, _ := g.doWith("GET", "/e2b/health", nil, map[string]string{"E2b-Sandbox-Id": id}); status != http.StatusBadGateway {
		t.Fatalf("health of a killed sandbox: %d, want 502", status)
	}

	// A sandbox whose timeout runs out is killed.
	short, _ := e2bSandbox(t, g, `{"timeout":1}`)
	checkFor(t, 30*time.Second, "the sandbox's timeout kills it", func() bool { return len(sandboxContexts(t, g, short)) == 0 })

	// Shutting the gateway down kills the sandboxes left.
	last, _ := e2bSandbox(t, g, `{}`)
	c, _ = g.mgr.Context(sandboxContexts(t, g, last)[0])
	root := filepath.Dir(c.Workspace().Dir())
	g.srv.e2b.Close()
	if left := sandboxContexts(t, g, last); len(left) != 0 {
		t.Fatalf("contexts after Close: %v", left)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("sandbox folders after Close: %v", entries)
	}
}

// A sandbox's timeout counts from its creation's answer: a kernel that
// takes longer to start than a short timeout still gives a sandbox, which
// the timeout then ends.
func TestE2BShortTimeoutOutlastsASlowKernelStart(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "slowpy"), 0o755)
	os.WriteFile(filepath.Join(dir, "slowpy", "kernel.json"), []byte(`{"argv":["/bin/sh","-c","sleep 2; exec /usr/bin/python3 -m ipykernel_launcher -f \"$0\"","{connection_file}"],"display_name":"slow","language":"python"}`), 0o644)
	g := newGatewayWithDirs(t, []string{dir}, func(m *sessions.Config, _ *Config) {
		m.Languages = map[string]string{"python": "slowpy"}
	})
	id, _ := e2bSandbox(t, g, `{"timeout":1}`)
	if ctxs := sandboxContexts(t, g, id); len(ctxs) != 1 {
		t.Fatalf("sandbox contexts = %v, want its python context", ctxs)
	}
	checkFor(t, 30*time.Second, "the sandbox's timeout kills it", func() bool { return len(sandboxContexts(t, g, id)) == 0 })
}

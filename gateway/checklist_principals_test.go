package gateway

// The checklist, 14-15: ids and other principals (helpers in checklist_helpers_test.go).

import (
	"bytes"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/uuid"

	"kernelgate/sessions"
)

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

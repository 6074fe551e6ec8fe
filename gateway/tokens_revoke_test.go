package gateway

import (
	"net/http"
	"testing"
	"time"

	"kernelgate/sessions"
)

// TestRevokeClosesContextTokenWebsockets: revoking a context's tokens (one
// context, then all) also closes the kernel websockets those tokens
// opened, while a websocket opened with another credential on the same
// kernel stays and runs code.
func TestRevokeClosesContextTokenWebsockets(t *testing.T) {
	g := newGateway(t)
	if status, body := g.do("POST", "/api/contexts", map[string]any{"id": "ws-revoke"}); status != http.StatusCreated {
		t.Fatalf("context: %d %s", status, body)
	}
	kernel := *decode[sessions.ContextModel](t, mustGet(t, g, "/api/contexts/ws-revoke")).KernelID
	admin := g.mustDial(kernel, true)
	for _, revoke := range []string{"/api/contexts/ws-revoke/tokens", "/api/context-tokens"} {
		status, body := g.do("POST", "/api/contexts/ws-revoke/tokens", map[string]any{"ttl": 600})
		if status != http.StatusCreated {
			t.Fatalf("mint: %d %s", status, body)
		}
		tok := decode[map[string]string](t, body)["token"]
		c, resp, err := g.dial(kernel, "", true, http.Header{"Authorization": {"Bearer " + tok}})
		if err != nil {
			t.Fatalf("dial with the context token: %v %v", err, resp)
		}
		c.untilDone(30*time.Second, c.execute("1", false)) // it works
		if status, body := g.do("DELETE", revoke, nil); status != http.StatusNoContent {
			t.Fatalf("DELETE %s: %d %s", revoke, status, body)
		}
		deadline := time.After(10 * time.Second)
	drain:
		for {
			select {
			case _, open := <-c.msgs:
				if !open {
					break drain
				}
			case <-deadline:
				t.Fatalf("DELETE %s: the websocket of a revoked token is still open", revoke)
			}
		}
		if _, resp, err := g.dial(kernel, "", true, http.Header{"Authorization": {"Bearer " + tok}}); err == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("DELETE %s: a revoked token opens a websocket: %v", revoke, err)
		}
		admin.untilDone(30*time.Second, admin.execute("2", false))
	}
}

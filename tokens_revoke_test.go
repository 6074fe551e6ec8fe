//go:build linux

package main

import (
	"syscall"
	"testing"
)

// TestContextTokensRevoked revokes the tokens of one context, then every
// context token, on the real binary with a state directory: a revoked
// token is refused at once and stays refused after a restart, while a
// token minted after the revocation lives on.
func TestContextTokensRevoked(t *testing.T) {
	bin := buildBinary(t)
	dirs := newRestartDirs(t)
	const admin = "revoke-admin-token"
	g := dirs.start(t, bin, "--pool-size", "0", "--token", admin)
	for _, id := range []string{"a", "b"} {
		callAs(t, admin, "POST", g.url+"api/contexts", map[string]any{"id": id, "language": "python"}, 201, nil)
	}
	mint := func(url, id string) string {
		t.Helper()
		var tok struct{ Token string }
		callAs(t, admin, "POST", url+"api/contexts/"+id+"/tokens", map[string]any{"ttl": 3600}, 201, &tok)
		return tok.Token
	}
	works := func(url, tok, id string, want int) {
		t.Helper()
		callAs(t, tok, "GET", url+"api/contexts/"+id, nil, want, nil)
	}
	a1, a2, b1 := mint(g.url, "a"), mint(g.url, "a"), mint(g.url, "b")

	// A context token cannot revoke, not even its own context's tokens.
	callAs(t, a1, "DELETE", g.url+"api/contexts/a/tokens", nil, 403, nil)
	callAs(t, a1, "DELETE", g.url+"api/context-tokens", nil, 403, nil)
	works(g.url, a1, "a", 200)

	// One context's tokens: those of the others still work.
	callAs(t, admin, "DELETE", g.url+"api/contexts/a/tokens", nil, 204, nil)
	works(g.url, a1, "a", 401)
	works(g.url, a2, "a", 401)
	works(g.url, b1, "b", 200)
	callAs(t, admin, "DELETE", g.url+"api/contexts/nope/tokens", nil, 404, nil)

	// Every context token at once.
	a3 := mint(g.url, "a")
	works(g.url, a3, "a", 200)
	callAs(t, admin, "DELETE", g.url+"api/context-tokens", nil, 204, nil)
	works(g.url, a3, "a", 401)
	works(g.url, b1, "b", 401)
	// The contexts are untouched, and a new token works.
	callAs(t, admin, "GET", g.url+"api/contexts/a", nil, 200, nil)
	a4 := mint(g.url, "a")
	works(g.url, a4, "a", 200)

	// After a crash and a restart on the same state: still revoked; the
	// token minted after the revocation was kept and works.
	g.kill(t, syscall.SIGKILL)
	g2 := dirs.start(t, bin, "--pool-size", "0", "--token", admin)
	for _, tok := range []string{a1, a2, a3} {
		works(g2.url, tok, "a", 401)
	}
	works(g2.url, b1, "b", 401)
	works(g2.url, a4, "a", 200)
}

//go:build linux

package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"kernelgate/internal/pgtest"
)

// TestRestartPostgresAfterSIGKILL: with --state-url the records live in
// PostgreSQL. A context with state and its token survive a SIGKILL of
// the gateway and a restart on the same database (after the dead
// process's lease lapses); a second gateway on that database serves
// beside it as a replica; the URL's password is in no log.
func TestRestartPostgresAfterSIGKILL(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	const secret = "pg-secret-pw"
	url := strings.Replace(srv.CreateDB("gateway"), "postgres@", "postgres:"+secret+"@", 1)
	dirs := newRestartDirs(t)
	const admin = "restart-admin-token"
	clusterSecret := filepath.Join(t.TempDir(), "cluster-secret")
	os.WriteFile(clusterSecret, []byte(replicaSecret), 0o600)
	start := func() *gatewayProcess {
		return startGateway(t, bin, "--state-url", url, "--cluster-secret-file", clusterSecret, "--runtime-dir", dirs.runtime, "--pool-size", "0", "--token", admin, "--lease", "2s")
	}
	g := start()
	callAs(t, admin, "POST", g.url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, nil)
	var e execution
	callAs(t, admin, "POST", g.url+"api/execute", map[string]any{"context": "agent", "code": "x = 41"}, 200, &e)
	if e.Process.Reason != "completed" {
		t.Fatalf("setting x: %+v", e)
	}
	var tok struct{ Token string }
	callAs(t, admin, "POST", g.url+"api/contexts/agent/tokens", map[string]any{"ttl": 3600}, 201, &tok)
	g.kill(t, syscall.SIGKILL)

	g2 := start()
	callAs(t, tok.Token, "POST", g2.url+"api/execute", map[string]any{"context": "agent", "code": "x + 1"}, 200, &e)
	if e.text() != "42" {
		t.Fatalf("the context after the restart: %+v, want 42", e)
	}

	// A second gateway on the same database serves beside it as a
	// replica: each names itself and both in GET /api/status, and the
	// context carries the URL of the replica that owns its kernel.
	g3 := startGateway(t, bin, "--state-url", url, "--cluster-secret-file", clusterSecret, "--runtime-dir", t.TempDir(), "--pool-size", "0", "--token", admin, "--lease", "2s")
	type status struct {
		Replica  string   `json:"replica"`
		Replicas []string `json:"replicas"`
	}
	self := func(g *gatewayProcess) string { return strings.TrimSuffix(g.url, "/") }
	for _, g := range []*gatewayProcess{g2, g3} {
		var st status
		waitFor(t, func() bool {
			callAs(t, admin, "GET", g.url+"api/status", nil, 200, &st)
			return st.Replica == self(g) && slices.Contains(st.Replicas, self(g2)) && slices.Contains(st.Replicas, self(g3))
		}, "%s/api/status: %+v, want itself and both replicas live", func() []any { return []any{self(g), st} })
	}
	var cm struct{ Replica string }
	callAs(t, admin, "GET", g2.url+"api/contexts/agent", nil, 200, &cm)
	if cm.Replica != self(g2) {
		t.Errorf("the context's replica: %q, want its owner %q", cm.Replica, self(g2))
	}
	for name, log := range map[string]string{"first": g.logs.String(), "second": g2.logs.String(), "replica": g3.logs.String()} {
		if strings.Contains(log, secret) {
			t.Errorf("the %s gateway's log holds the database password", name)
		}
	}
}

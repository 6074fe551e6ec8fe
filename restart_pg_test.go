//go:build linux

package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
)

// TestRestartPostgresAfterSIGKILL: with --state-url the records live in
// PostgreSQL. A context with state and its token survive a SIGKILL of
// the gateway and a restart on the same database; a second gateway on
// that database while one serves refuses to start; the URL's password
// is in no log.
func TestRestartPostgresAfterSIGKILL(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	const secret = "pg-secret-pw"
	url := strings.Replace(srv.CreateDB("gateway"), "postgres@", "postgres:"+secret+"@", 1)
	dirs := newRestartDirs(t)
	const admin = "restart-admin-token"
	start := func() *gatewayProcess {
		return startGateway(t, bin, "--state-url", url, "--runtime-dir", dirs.runtime, "--pool-size", "0", "--token", admin)
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

	// A second gateway on the same database is refused.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "serve", "--port", "0", "--kernelspec-dir", kernelsDir(t), "--state-url", url,
		"--runtime-dir", t.TempDir(), "--pool-size", "0", "--token", admin)
	cmd.Env = append(os.Environ(), "XDG_STATE_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another kernelgate") {
		t.Errorf("a second gateway on the database: %v, want a refusal saying why:\n%s", err, out)
	}
	for name, log := range map[string]string{"first": g.logs.String(), "second": g2.logs.String(), "refused": string(out)} {
		if strings.Contains(log, secret) {
			t.Errorf("the %s gateway's log holds the database password", name)
		}
	}
}

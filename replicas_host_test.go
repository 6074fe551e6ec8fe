//go:build linux

package main

import (
	"context"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"

	"kernelgate/internal/pgtest"
)

// TestReplicasLeaveKernelsOfAnotherHost: a local kernel's record names
// its host; when its owner dies, a replica on another host does not
// adopt it by its pid (a pid of another host may be any process here):
// it says so in its log, takes neither the kernel nor its context (the
// records stay as they were, the kernel process runs on), and gives the
// lease back. Here the survivor runs on the same machine and the record
// is made to name another host.
func TestReplicasLeaveKernelsOfAnotherHost(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	gs := startReplicas(t, bin, srv, "hosts", 2, "--lease", "2s")
	a, b := gs[0], gs[1]
	call(t, "POST", a.url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, nil)
	var e execution
	call(t, "POST", a.url+"api/execute", map[string]any{"context": "agent", "code": "x = 41"}, 200, &e)
	var cm struct {
		KernelID        string `json:"kernelId"`
		KernelProcessID int    `json:"kernelProcessId"`
	}
	call(t, "GET", a.url+"api/contexts/agent", nil, 200, &cm)
	if cm.KernelProcessID == 0 {
		t.Fatalf("the context's kernel has no pid: %+v", cm)
	}

	a.kill(t, syscall.SIGKILL)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, strings.Replace(srv.URL(), "/postgres?", "/hosts?", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tag, err := conn.Exec(ctx, `UPDATE kernels SET data = jsonb_set(data::jsonb, '{provisionerInfo,data,hostname}', '"another-host"')::json WHERE id = $1`, cm.KernelID)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("naming another host in the kernel's record: %v, %v", tag, err)
	}

	waitFor(t, func() bool { return strings.Contains(b.logs.String(), "kernel left to the replicas of its host") },
		"the survivor did not say it leaves the kernel of another host:\n%s", func() []any { return []any{b.logs} })
	if code, err := tryCall(b.url+"api/contexts/agent", &cm); code != 404 {
		t.Errorf("the context through the survivor: %d, %v; want 404 (left to its host)", code, err)
	}
	var st struct{ Kernels int }
	call(t, "GET", b.url+"api/status", nil, 200, &st)
	if st.Kernels != 0 {
		t.Errorf("the survivor has %d kernels, want none", st.Kernels)
	}
	if err := syscall.Kill(cm.KernelProcessID, 0); err != nil {
		t.Errorf("the kernel process %d: %v, want it left running", cm.KernelProcessID, err)
	}
	var kernel string
	if err := conn.QueryRow(ctx, `SELECT data->>'kernelId' FROM contexts WHERE id = 'agent'`).Scan(&kernel); err != nil || kernel != cm.KernelID {
		t.Errorf("the context's record names kernel %q (%v), want %s as before", kernel, err, cm.KernelID)
	}
	var owner string
	if err := conn.QueryRow(ctx, `SELECT owner FROM leases WHERE kernel_id = $1`, cm.KernelID).Scan(&owner); err != nil || owner != "" {
		t.Errorf("the kernel's lease is held by %q (%v), want it free for a replica of its host", owner, err)
	}
	if n := strings.Count(b.logs.String(), "kernel left to the replicas of its host"); n != 1 {
		t.Errorf("the survivor took the kernel and left it %d times, want once", n)
	}
	// The kernel process is this test's to end.
	syscall.Kill(-cm.KernelProcessID, syscall.SIGKILL)
}

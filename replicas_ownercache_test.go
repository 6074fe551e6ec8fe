//go:build linux

package main

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"kernelgate/internal/pgtest"
)

// TestReplicasOwnerCacheFollowsAMovedLease: C runs code in a context A
// owns (C keeps A as its owner), then the context's lease moves to B
// while A lives on (the store's transfer a handover makes, under the
// next epoch). Every run through C afterwards is answered, on the
// context's one kernel (its state kept), and A, which no longer owns
// the context, is asked by C at most once: C forgot the owner it kept
// as soon as A did not take a run, and asks B from then on.
func TestReplicasOwnerCacheFollowsAMovedLease(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	// A long lease: C keeps the owner it found for lease/3 (10 s), longer
	// than the test takes.
	gs := startReplicas(t, bin, srv, "ownercache", 3, "--lease", "30s")
	dbURL := strings.Replace(srv.URL(), "/postgres?", "/ownercache?", 1)
	a, b, c := gs[0], gs[1], gs[2]
	call(t, "POST", a.url+"api/contexts", map[string]any{"id": "moving", "language": "python"}, 201, nil)
	if e := execute(t, c.url, "moving", "x = 41"); e.Process.Reason != "completed" {
		t.Fatalf("x = 41 through C: %+v", e)
	}
	before := executeAnswers(t, a, "503")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tag, err := conn.Exec(ctx, `UPDATE leases SET owner = (SELECT id FROM replicas WHERE url = $1), epoch = epoch + 1,
		expires_at = now() + interval '30 seconds'
		WHERE kernel_id = (SELECT data->>'kernelId' FROM contexts WHERE id = 'moving')`, replicaURL(b))
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("moving the context's lease to B: %v (%v)", err, tag)
	}

	const runs = 4
	for i := range runs {
		e := execute(t, c.url, "moving", "x += 1; x")
		if want := strconv.Itoa(42 + i); e.text() != want {
			t.Fatalf("run %d through C after the lease moved: %+v, want x = %s (the context's kernel, its state kept)", i+1, e, want)
		}
	}
	if asked := executeAnswers(t, a, "503") - before; asked > 1 {
		t.Errorf("A, which no longer owns the context, refused %d of the %d runs sent through C: C kept asking the owner it had cached, want at most 1\nC:\n%s", asked, runs, c.logs)
	}
	var cm struct{ Replica string }
	call(t, "GET", c.url+"api/contexts/moving", nil, 200, &cm)
	if cm.Replica != replicaURL(b) {
		t.Errorf("the context's owner is %s, want B (%s)", cm.Replica, replicaURL(b))
	}
}

// executeAnswers is how many POST /api/execute g answered with code, by
// its /metrics.
func executeAnswers(t *testing.T, g *gatewayProcess, code string) int {
	t.Helper()
	resp, err := http.Get(g.url + "metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "kernelgate_http_requests_total{") && strings.Contains(line, `route="/api/execute"`) &&
			strings.Contains(line, `code="`+code+`"`) {
			n, _ := strconv.Atoi(line[strings.LastIndexByte(line, ' ')+1:])
			return n
		}
	}
	return 0
}

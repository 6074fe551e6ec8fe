//go:build linux

package main

import (
	"bufio"
	"context"

	"github.com/jackc/pgx/v5"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"kernelgate/internal/pgtest"
)

// poolReady is the replica's ready warm-pool kernels, as /metrics says.
func poolReady(t *testing.T, g *gatewayProcess) int {
	t.Helper()
	resp, err := http.Get(g.url + "metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "kernelgate_pool_ready_kernels{"); ok {
			_, v, _ := strings.Cut(rest, "} ")
			f, _ := strconv.ParseFloat(v, 64)
			n += int(f)
		}
	}
	return n
}

// TestReplicasPoolKernelsCountClusterWide: two replicas with
// --max-kernels 2 and a warm pool of one each: the pools' kernels count
// for the other replica as its own kernels do. A context that cannot
// take a pooled kernel (its env needs a fresh process) takes its
// replica's pooled kernel's place rather than a third place; a third
// kernel is refused through either; and the places of the pool kernels
// stopped for room are free again for both replicas once the contexts
// are gone (a stopped pool kernel's lease is released, never counted
// on).
func TestReplicasPoolKernelsCountClusterWide(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	gs := startReplicas(t, bin, srv, "pools", 2, "--max-kernels", "2", "--pool-size", "1", "--pool-prewarm", "python")
	a, b := gs[0], gs[1]
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("A's log:\n%s\nB's log:\n%s", a.logs, b.logs)
			if conn, err := pgx.Connect(context.Background(), strings.Replace(srv.URL(), "/postgres?", "/pools?", 1)); err == nil {
				rows, _ := conn.Query(context.Background(), "SELECT kernel_id, owner, epoch, expires_at > now() FROM leases")
				for rows.Next() {
					var k, o string
					var e int64
					var live bool
					rows.Scan(&k, &o, &e, &live)
					t.Logf("lease %s owner %s epoch %d live %v", k, o, e, live)
				}
				conn.Close(context.Background())
			}
		}
	})
	waitFor(t, func() bool { return poolReady(t, a) == 1 && poolReady(t, b) == 1 },
		"the pools did not fill: A %d, B %d", func() []any { return []any{poolReady(t, a), poolReady(t, b)} })

	fresh := map[string]any{"language": "python", "env": map[string]string{"TZ": "UTC"}}
	with := func(id string) map[string]any {
		m := map[string]any{"id": id}
		for k, v := range fresh {
			m[k] = v
		}
		return m
	}
	call(t, "POST", a.url+"api/contexts", with("one"), 201, nil)
	if n := poolReady(t, a); n != 0 {
		t.Errorf("A's pool holds %d kernels beside its context's and B's pooled one, past --max-kernels 2", n)
	}
	call(t, "POST", b.url+"api/contexts", with("two"), 201, nil)
	if n := poolReady(t, b); n != 0 {
		t.Errorf("B's pool holds %d kernels beside its context's and A's, past --max-kernels 2", n)
	}
	var refused struct{ Code string }
	for _, g := range gs {
		call(t, "POST", g.url+"api/contexts", with("three"), 429, &refused)
		if refused.Code != "RESOURCE_EXHAUSTED" {
			t.Errorf("a third kernel through %s: %q, want RESOURCE_EXHAUSTED", g.url, refused.Code)
		}
	}

	// The contexts gone, both places are free for either replica.
	call(t, "DELETE", a.url+"api/contexts/one", nil, 204, nil)
	call(t, "DELETE", b.url+"api/contexts/two", nil, 204, nil)
	call(t, "POST", a.url+"api/contexts", with("three"), 201, nil)
	call(t, "POST", b.url+"api/contexts", with("four"), 201, nil)
	for _, id := range []string{"three", "four"} {
		if e := execute(t, b.url, id, "6 * 7"); e.text() != "42" {
			t.Errorf("context %s: %+v", id, e)
		}
	}
}

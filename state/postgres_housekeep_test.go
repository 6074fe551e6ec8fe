package state

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"kernelgate/internal/pgtest"
)

// TestPostgresHousekeep: the rows of replicas dead for longer than the
// limit go, and so do the lease rows of kernels without a record that no
// replica held for that long; a live replica's row, one silent for less,
// a lease held (a warm-pool kernel's, which has no record), a lease
// released lately, and the lease of a kernel with a record stay.
func TestPostgresHousekeep(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("housekeep")
	ctx := context.Background()
	a := openPG(t, url, PostgresOptions{Replica: "a"})
	defer a.Close()
	const lease = time.Minute
	for _, id := range []string{"dead", "silent", "a"} {
		p := a
		if id != "a" {
			p = openPG(t, url, PostgresOptions{Replica: id})
		}
		must(t, p.JoinReplicas(ctx, "http://"+id))
		for _, k := range []string{id + "-pool", id + "-deleted", id + "-released", id + "-recorded"} {
			l, err := p.AcquireLease(ctx, k, lease)
			must(t, err)
			if k == id+"-recorded" {
				must(t, Fenced(p, l.Fence()).PutKernel(ctx, sampleKernel(k)))
			}
			if k == id+"-deleted" || k == id+"-released" {
				must(t, p.ReleaseLease(ctx, l.Fence()))
			}
		}
		if p != a {
			must(t, p.Close())
		}
	}
	// "dead" died two hours ago, its leases lapsed then; "silent" was
	// last heard ten minutes ago; the kernels "-deleted" were released two
	// hours ago.
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := a.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`UPDATE replicas SET heard_at = now() - interval '2 hours' WHERE id = 'dead'`)
	exec(`UPDATE leases SET expires_at = now() - interval '2 hours' WHERE owner = 'dead' OR kernel_id LIKE '%-deleted'`)
	exec(`UPDATE replicas SET heard_at = now() - interval '10 minutes' WHERE id = 'silent'`)
	exec(`UPDATE leases SET expires_at = now() - interval '10 minutes' WHERE owner = 'silent'`)
	exec(`UPDATE cluster_clock SET heard_at = now()`)

	replicas, leases, err := a.Housekeep(ctx, time.Hour)
	must(t, err)
	var ids, kernels []string
	rows, _ := a.pool.Query(ctx, "SELECT id FROM replicas ORDER BY id")
	ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
	must(t, err)
	rows, _ = a.pool.Query(ctx, "SELECT kernel_id FROM leases ORDER BY kernel_id")
	kernels, err = pgx.CollectRows(rows, pgx.RowTo[string])
	must(t, err)
	if want := []string{"a", "silent"}; !slices.Equal(ids, want) || replicas != 1 {
		t.Errorf("replicas left %v (%d removed), want %v (1 removed)", ids, replicas, want)
	}
	// Gone: the deleted kernels' (released two hours ago) and the dead
	// replica's warm-pool kernel's (lapsed two hours ago).
	want := []string{"a-pool", "a-recorded", "a-released", "dead-recorded", "dead-released", "silent-pool", "silent-recorded", "silent-released"}
	if !slices.Equal(kernels, want) || leases != 4 {
		t.Errorf("leases left %v (%d removed), want %v (4 removed)", kernels, leases, want)
	}
	if o, err := a.LeaseOwner(ctx, "a-pool"); err != nil || o.Owner != "a" {
		t.Errorf("a's held lease after the housekeeping: %+v, %v", o, err)
	}
}

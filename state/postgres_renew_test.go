package state

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
)

// TestPostgresRenewWhileFencedCommits: a replica renewing its leases from
// several goroutines while it commits writes under each of them, all in
// shuffled orders: no renewal fails (renewals and fenced commits lock the
// lease rows in one order, so they never deadlock) and every write is
// committed.
func TestPostgresRenewWhileFencedCommits(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("renewfence")
	ctx := context.Background()
	a := openPG(t, url, PostgresOptions{Replica: "a"})
	defer a.Close()
	const n = 40
	var held []Fence
	for i := range n {
		l, err := a.AcquireLease(ctx, fmt.Sprintf("k%02d", i), time.Minute)
		must(t, err)
		held = append(held, l.Fence())
	}
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for w := range 4 {
		wg.Go(func() {
			for range 30 {
				order := rand.Perm(n)
				var inner sync.WaitGroup
				for _, i := range order {
					inner.Go(func() {
						if err := Fenced(a, held[i]).PutKernel(ctx, sampleKernel(held[i].Kernel)); err != nil {
							errs <- fmt.Errorf("write under %v: %w", held[i], err)
						}
					})
				}
				shuffled := make([]Fence, n)
				for j, i := range rand.Perm(n) {
					shuffled[j] = held[i]
				}
				still, err := a.RenewLeases(ctx, shuffled, time.Minute)
				if err != nil || len(still) != n {
					errs <- fmt.Errorf("renewal %d: %d of %d renewed, %v", w, len(still), n, err)
				}
				inner.Wait()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

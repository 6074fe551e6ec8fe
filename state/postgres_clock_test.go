package state

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
)

// TestPostgresLeasesOutlastAnOutage: the database stopped for longer
// than the lease, then started again. The leases held when it stopped
// have not lapsed for the outage: the kernels are not free, another
// replica cannot take them, their holder renews them under the same
// epoch and writes under their fences, and the replicas live when it
// stopped are live again. A lease whose holder alone stops renewing
// while another replica is heard still lapses and is taken over.
func TestPostgresLeasesOutlastAnOutage(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("outage")
	ctx := context.Background()
	a := openPG(t, url, PostgresOptions{Replica: "a"})
	defer a.Close()
	b := openPG(t, url, PostgresOptions{Replica: "b"})
	defer b.Close()
	const lease = time.Second
	for _, p := range []*Postgres{a, b} {
		_, err := p.Heartbeat(ctx, "http://"+p.Replica(), lease)
		must(t, err)
	}
	l1, err := a.AcquireLease(ctx, "k1", lease)
	must(t, err)
	must(t, Fenced(a, l1.Fence()).PutKernel(ctx, sampleKernel("k1")))

	srv.Stop("immediate")
	waitUntil(t, func() bool { return time.Now().After(l1.Expires.Add(2 * lease)) }, "the lease's end")
	srv.StartAgain()

	waitUntil(t, func() bool {
		_, err := b.FreeKernels(ctx)
		return err == nil
	}, "the database answering again")
	if free, err := b.FreeKernels(ctx); err != nil || len(free) != 0 {
		t.Errorf("free kernels after the outage: %v, %v; want none (k1's lease did not lapse for the outage)", free, err)
	}
	if l, err := b.AcquireLease(ctx, "k1", lease); !errors.Is(err, ErrLeaseHeld) {
		t.Errorf("b acquires k1 after the outage: %+v, %v; want ErrLeaseHeld", l, err)
	}
	if got, err := a.LeaseOwner(ctx, "k1"); err != nil || got.Owner != "a" || got.Epoch != l1.Epoch {
		t.Errorf("k1's lease after the outage: %+v, %v; want a's, epoch %d", got, err, l1.Epoch)
	}
	still, err := a.RenewLeases(ctx, []Fence{l1.Fence()}, lease)
	if err != nil || !slices.Equal(still, []Fence{l1.Fence()}) {
		t.Errorf("a renews k1 after the outage: %v, %v; want it renewed under epoch %d", still, err, l1.Epoch)
	}
	if err := Fenced(a, l1.Fence()).PutKernel(ctx, sampleKernel("k1")); err != nil {
		t.Errorf("a writes under k1's fence after the outage: %v", err)
	}
	live, err := b.LiveReplicas(ctx, lease)
	must(t, err)
	if len(live) != 2 {
		t.Errorf("live replicas after the outage: %+v, want a and b", live)
	}

	// a stops renewing while b is heard: a's lease lapses, b takes k1.
	l1, err = a.LeaseOwner(ctx, "k1")
	must(t, err)
	waitUntil(t, func() bool {
		_, err := b.Heartbeat(ctx, "http://b", lease)
		must(t, err)
		return time.Now().After(l1.Expires.Add(lease / 4))
	}, "a's lease's end while b is heard")
	if free, err := b.FreeKernels(ctx); err != nil || !slices.Equal(free, []string{"k1"}) {
		t.Errorf("free kernels once a stopped renewing: %v, %v; want k1", free, err)
	}
	if l, err := b.AcquireLease(ctx, "k1", lease); err != nil || l.Epoch != l1.Epoch+1 {
		t.Errorf("b takes k1 over: %+v, %v; want epoch %d", l, err, l1.Epoch+1)
	}
}

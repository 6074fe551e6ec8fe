package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"kernelgate/internal/leakcheck"
	"kernelgate/internal/pgtest"
	"kernelgate/state"
)

// testLease is the lease of the tests' replicas: short, so that a frozen
// replica loses its leases quickly, long enough for a loaded machine.
const testLease = time.Second

// waitFor polls ok until it holds, failing with what() after 30 s.
func waitFor(t *testing.T, ok func() bool, what func() string) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for !ok() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out: %s", what())
		}
	}
}

func openReplica(t *testing.T, url, id string) *state.Postgres {
	t.Helper()
	s, err := state.OpenPostgres(context.Background(), url, state.PostgresOptions{Replica: id})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestKeeperReportsLeaseTaken: a lease taken from under its keeper (freed
// in the store and acquired by another replica) is reported lost at the
// next renewal, once, and forgotten; the keeper's other lease is kept.
func TestKeeperReportsLeaseTaken(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("taken")
	before := leakcheck.Snapshot(t)
	ctx := context.Background()
	a, b := openReplica(t, url, "a"), openReplica(t, url, "b")
	lostc := make(chan []state.Fence, 4)
	ka, err := NewKeeper(a, Config{Lease: testLease}, func(lost []state.Fence) { lostc <- lost })
	if err != nil {
		t.Fatal(err)
	}
	l1, err := ka.Acquire(ctx, "k1")
	if err != nil {
		t.Fatal(err)
	}
	l2, err := ka.Acquire(ctx, "k2")
	if err != nil {
		t.Fatal(err)
	}
	// A renewal goes by: both are extended.
	for _, l := range []state.Lease{l1, l2} {
		var now state.Lease
		waitFor(t, func() bool {
			now, err = a.LeaseOwner(ctx, l.Kernel)
			return err == nil && now.Expires.After(l.Expires)
		}, func() string { return fmt.Sprintf("%s renewed: %+v, %v", l.Kernel, now, err) })
	}
	if err := a.ReleaseLease(ctx, l1.Fence()); err != nil { // as if it had lapsed
		t.Fatal(err)
	}
	lb, err := b.AcquireLease(ctx, "k1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case lost := <-lostc:
		if len(lost) != 1 || lost[0] != l1.Fence() {
			t.Errorf("lost %v, want %v", lost, l1.Fence())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the keeper did not report k1 lost")
	}
	if _, ok := ka.Fence("k1"); ok {
		t.Error("the keeper still gives a fence for k1")
	}
	if f, ok := ka.Fence("k2"); !ok || f != l2.Fence() {
		t.Errorf("k2's fence: %v %v, want %v", f, ok, l2.Fence())
	}
	if lb.Epoch != l1.Epoch+1 {
		t.Errorf("b's epoch %d, want %d", lb.Epoch, l1.Epoch+1)
	}
	ka.Close()
	select {
	case lost := <-lostc:
		t.Errorf("reported lost again: %v", lost)
	default:
	}
	a.Close()
	b.Close()
	leakcheck.Check(t, before)
}

// TestKeeperHandover: a lease handed to a live replica under the next
// epoch is adopted by it; the old owner's writes under its epoch are
// refused and the new owner's go in. A handover to a replica that is not
// live keeps the lease where it was.
func TestKeeperHandover(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("handover")
	ctx := context.Background()
	a, b := openReplica(t, url, "a"), openReplica(t, url, "b")
	defer a.Close()
	defer b.Close()
	cfg := Config{Lease: testLease}
	mb, err := Join(ctx, b, Config{URL: "http://b.test", Lease: testLease})
	if err != nil {
		t.Fatal(err)
	}
	defer mb.Close(ctx)
	ka, err := NewKeeper(a, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ka.Close()
	kb, err := NewKeeper(b, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer kb.Close()
	la, err := ka.Acquire(ctx, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ka.Handover(ctx, "k1", "nobody"); !errors.Is(err, state.ErrNoReplica) {
		t.Fatalf("handover to no replica: %v, want ErrNoReplica", err)
	}
	if f, ok := ka.Fence("k1"); !ok || f != la.Fence() {
		t.Fatalf("after a failed handover a holds %v %v, want %v", f, ok, la.Fence())
	}
	if _, err := kb.Adopt(ctx, "k1"); !errors.Is(err, state.ErrLeaseHeld) {
		t.Errorf("b adopts a lease a holds: %v, want ErrLeaseHeld", err)
	}
	lt, err := ka.Handover(ctx, "k1", "b")
	if err != nil {
		t.Fatal(err)
	}
	if lt.Owner != "b" || lt.OwnerURL != "http://b.test" || lt.Epoch != la.Epoch+1 {
		t.Errorf("handed over as %+v", lt)
	}
	lb, err := kb.Adopt(ctx, "k1")
	if err != nil || lb.Fence() != lt.Fence() {
		t.Fatalf("b adopts: %+v, %v; want %v", lb, err, lt.Fence())
	}
	if _, ok := ka.Fence("k1"); ok {
		t.Error("a still gives a fence for k1")
	}
	if err := state.Fenced(a, la.Fence()).PutKernel(ctx, state.Kernel{ID: "k1", Spec: "a"}); !errors.Is(err, state.ErrFenced) {
		t.Errorf("a writes after the handover: %v, want ErrFenced", err)
	}
	if err := state.Fenced(b, lb.Fence()).PutKernel(ctx, state.Kernel{ID: "k1", Spec: "b"}); err != nil {
		t.Errorf("b writes after adopting: %v", err)
	}
	if err := kb.Release(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.LeaseOwner(ctx, "k1"); !errors.Is(err, state.ErrNoLease) {
		t.Errorf("owner after release: %v, want ErrNoLease", err)
	}
}

// TestConfigLease: a lease below MinLease is refused before anything is
// written; zero takes the default.
func TestConfigLease(t *testing.T) {
	c := Config{Lease: 10 * time.Millisecond}
	if err := c.defaults(); !errors.Is(err, ErrLeaseTooShort) {
		t.Errorf("a 10ms lease: %v, want ErrLeaseTooShort", err)
	}
	c = Config{}
	if err := c.defaults(); err != nil || c.Lease != DefaultLease {
		t.Errorf("no lease: %v, %v; want %v", c.Lease, err, DefaultLease)
	}
}

// TestKeeperKeepsLeasesThroughAnOutage: while the database does not
// answer (stopped, as a crash or a partition of every replica would),
// the keeper cannot renew: once the lease has run out by its own clock,
// its leases are unconfirmed (Fence false: act no more) but neither
// reported lost nor forgotten (Term keeps their fences). When the
// database is back past the lease, the store's clock has not run for
// the outage: the leases are confirmed again under the same epochs,
// another replica cannot acquire them, and writes under them commit.
func TestKeeperKeepsLeasesThroughAnOutage(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("gone")
	ctx := context.Background()
	a := openReplica(t, url, "a")
	defer a.Close()
	b := openReplica(t, url, "b")
	defer b.Close()
	lostc := make(chan []state.Fence, 4)
	ka, err := NewKeeper(a, Config{Lease: testLease}, func(lost []state.Fence) { lostc <- lost })
	if err != nil {
		t.Fatal(err)
	}
	defer ka.Close()
	var want []state.Fence
	var expires time.Time
	for _, k := range []string{"k1", "k2"} {
		l, err := ka.Acquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if err := state.Fenced(a, l.Fence()).PutKernel(ctx, state.Kernel{ID: k, Spec: "a"}); err != nil {
			t.Fatal(err)
		}
		want = append(want, l.Fence())
		expires = l.Expires
	}
	srv.Stop("immediate")
	waitFor(t, func() bool {
		_, ok1 := ka.Fence("k1")
		_, ok2 := ka.Fence("k2")
		return !ok1 && !ok2
	}, func() string { return "the leases still confirmed a lease after the database stopped" })
	for _, f := range want {
		if got, ok := ka.Term(f.Kernel); !ok || got != f {
			t.Errorf("%s's term while the database is down: %v %v, want %v", f.Kernel, got, ok, f)
		}
	}
	// Past the lease by the database's clock too, then back.
	waitFor(t, func() bool { return time.Now().After(expires.Add(testLease)) }, func() string { return "" })
	srv.StartAgain()
	waitFor(t, func() bool {
		_, ok1 := ka.Fence("k1")
		_, ok2 := ka.Fence("k2")
		return ok1 && ok2
	}, func() string {
		return fmt.Sprintf("leases not confirmed after the database came back: held %v", ka.Held())
	})
	select {
	case lost := <-lostc:
		t.Errorf("leases reported lost because of the outage: %v", lost)
	default:
	}
	if held := ka.Held(); !slices.Equal(held, want) {
		t.Errorf("held after the outage %v, want the same terms %v", held, want)
	}
	if l, err := b.AcquireLease(ctx, "k1", testLease); !errors.Is(err, state.ErrLeaseHeld) {
		t.Errorf("another replica acquires k1 after the outage: %+v, %v; want ErrLeaseHeld", l, err)
	}
	if free, err := b.FreeKernels(ctx); err != nil || len(free) != 0 {
		t.Errorf("free kernels after the outage: %v, %v; want none", free, err)
	}
	if err := state.Fenced(a, want[0]).PutKernel(ctx, state.Kernel{ID: "k1", Spec: "after"}); err != nil {
		t.Errorf("a write under k1's term after the outage: %v", err)
	}
}

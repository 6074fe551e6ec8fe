package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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

// TestKeeperLosesLeasesWithTheStore: while the database does not answer
// (stopped, as a partition would), the keeper cannot renew and reports
// every lease lost once the lease has run out by its own clock; when the
// database is back, the kernel is acquired again under the next epoch.
func TestKeeperLosesLeasesWithTheStore(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("gone")
	ctx := context.Background()
	a := openReplica(t, url, "a")
	defer a.Close()
	lostc := make(chan []state.Fence, 4)
	ka, err := NewKeeper(a, Config{Lease: testLease}, func(lost []state.Fence) { lostc <- lost })
	if err != nil {
		t.Fatal(err)
	}
	defer ka.Close()
	var want []state.Fence
	for _, k := range []string{"k1", "k2"} {
		l, err := ka.Acquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, l.Fence())
	}
	srv.Stop("immediate")
	var lost []state.Fence
	for len(lost) < 2 {
		select {
		case l := <-lostc:
			lost = append(lost, l...)
		case <-time.After(30 * time.Second):
			t.Fatalf("lost %v while the database is down, want %v", lost, want)
		}
	}
	slices.SortFunc(lost, func(x, y state.Fence) int { return strings.Compare(x.Kernel, y.Kernel) })
	if !slices.Equal(lost, want) {
		t.Errorf("lost %v, want %v", lost, want)
	}
	if held := ka.Held(); len(held) != 0 {
		t.Errorf("still held: %v", held)
	}
	srv.StartAgain()
	var l state.Lease
	waitFor(t, func() bool {
		l, err = ka.Acquire(ctx, "k1")
		return err == nil
	}, func() string { return fmt.Sprintf("acquiring k1 again: %v", err) })
	if l.Epoch != want[0].Epoch+1 {
		t.Errorf("epoch after the outage %d, want %d", l.Epoch, want[0].Epoch+1)
	}
}

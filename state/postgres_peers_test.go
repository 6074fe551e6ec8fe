package state

import (
	"context"
	"errors"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
)

// TestPostgresPeerKernels: a replica counts the kernels whose lease
// another replica holds, never its own, a released one or a lapsed one.
func TestPostgresPeerKernels(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("peers")
	ctx := context.Background()
	a := openPG(t, url, PostgresOptions{Replica: "a"})
	defer a.Close()
	b := openPG(t, url, PostgresOptions{Replica: "b"})
	defer b.Close()
	count := func(p *Postgres) int {
		t.Helper()
		n, err := p.PeerKernels(ctx)
		must(t, err)
		return n
	}
	const ttl = time.Minute
	_, err := a.AcquireLease(ctx, "a1", ttl)
	must(t, err)
	_, err = a.AcquireLease(ctx, "a2", ttl)
	must(t, err)
	b1, err := b.AcquireLease(ctx, "b1", ttl)
	must(t, err)
	if n, m := count(a), count(b); n != 1 || m != 2 {
		t.Fatalf("a counts %d peer kernels, b %d: want 1 and 2", n, m)
	}
	must(t, b.ReleaseLease(ctx, b1.Fence()))
	if n := count(a); n != 0 {
		t.Errorf("after b released its lease a counts %d, want 0", n)
	}
	_, err = b.AcquireLease(ctx, "b2", 50*time.Millisecond)
	must(t, err)
	waitUntil(t, func() bool { return count(a) == 0 }, "a lapsed lease no longer counted")
	one := openPG(t, srv.CreateDB("peersone"), PostgresOptions{})
	defer one.Close()
	if _, err := one.PeerKernels(ctx); !errors.Is(err, ErrNotReplica) {
		t.Errorf("PeerKernels of a one-gateway store: %v, want ErrNotReplica", err)
	}
}

// TestPostgresLeaseClaimed: a kernel is claimed while a replica holds
// its lease and for grace after it lapsed; never when it was never
// owned or was released.
func TestPostgresLeaseClaimed(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("claimed")
	ctx := context.Background()
	a := openPG(t, url, PostgresOptions{Replica: "a"})
	defer a.Close()
	b := openPG(t, url, PostgresOptions{Replica: "b"})
	defer b.Close()
	claimed := func(kernel string, grace time.Duration) bool {
		t.Helper()
		c, err := b.LeaseClaimed(ctx, kernel, grace)
		must(t, err)
		return c
	}
	held, err := a.AcquireLease(ctx, "held", time.Minute)
	must(t, err)
	if !claimed("held", time.Microsecond) {
		t.Error("a kernel whose lease a holds is not claimed")
	}
	if claimed("never", time.Hour) {
		t.Error("a kernel never owned is claimed")
	}
	_, err = a.AcquireLease(ctx, "lapsed", 50*time.Millisecond)
	must(t, err)
	waitUntil(t, func() bool {
		_, err := b.LeaseOwner(ctx, "lapsed")
		if !errors.Is(err, ErrNoLease) {
			must(t, err)
		}
		return err != nil
	}, "the lease to lapse")
	if !claimed("lapsed", time.Hour) {
		t.Error("a kernel whose lease lapsed within the grace is not claimed")
	}
	if claimed("lapsed", time.Microsecond) {
		t.Error("a kernel whose lease lapsed before the grace is claimed")
	}
	must(t, a.ReleaseLease(ctx, held.Fence()))
	if claimed("held", time.Hour) {
		t.Error("a released kernel is claimed")
	}
}

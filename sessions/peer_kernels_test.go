package sessions

import (
	"context"
	"errors"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
	"kernelgate/state"
)

// TestMaxKernelsAcrossReplicas: two managers, each with its own replica
// store on one PostgreSQL, under MaxKernels 2 counted cluster-wide
// (Config.PeerKernels from the store): with one real kernel on each, a
// third start on either is ErrTooManyKernels (429 RESOURCE_EXHAUSTED);
// once one is shut down and its lease released, a start is allowed
// again. The test takes each kernel's lease as the replica that starts
// it would.
func TestMaxKernelsAcrossReplicas(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("maxkernels")
	ctx := context.Background()
	open := func(id string) *state.Postgres {
		p, err := state.OpenPostgres(ctx, url, state.PostgresOptions{Replica: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	storeA, storeB := open("a"), open("b")
	a := newRealManager(t, Config{MaxKernels: 2, PeerKernels: storeA.PeerKernels})
	b := newRealManager(t, Config{MaxKernels: 2, PeerKernels: storeB.PeerKernels})
	start := func(m *Manager, p *state.Postgres) (*Kernel, state.Lease, error) {
		t.Helper()
		k, err := m.StartKernel(ctx, StartOptions{Name: "python3"})
		if err != nil {
			return nil, state.Lease{}, err
		}
		l, err := p.AcquireLease(ctx, k.ID(), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return k, l, nil
	}
	if _, _, err := start(a, storeA); err != nil {
		t.Fatalf("first kernel, on a: %v", err)
	}
	kb, lb, err := start(b, storeB)
	if err != nil {
		t.Fatalf("second kernel, on b: %v", err)
	}
	if _, _, err := start(a, storeA); !errors.Is(err, ErrTooManyKernels) {
		t.Fatalf("third kernel of the cluster, on a: %v, want ErrTooManyKernels", err)
	}
	if _, _, err := start(b, storeB); !errors.Is(err, ErrTooManyKernels) {
		t.Fatalf("third kernel of the cluster, on b: %v, want ErrTooManyKernels", err)
	}
	if err := b.ShutdownKernel(ctx, kb.ID()); err != nil {
		t.Fatal(err)
	}
	if err := storeB.ReleaseLease(ctx, lb.Fence()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := start(a, storeA); err != nil {
		t.Fatalf("a start on a after b's kernel is gone: %v", err)
	}
}

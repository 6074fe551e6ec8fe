package sessions

import (
	"context"
	"errors"
	"testing"
)

// The warm pool counts toward MaxKernels, and a user's kernel wins over
// it: a pool kernel still starting is stopped to make room (a ready one
// is, against real kernels, in TestPoolWithinMaxKernels); past the limit
// with no pooled kernel left, a start is ErrTooManyKernels.
func TestPoolStartGivesWayToUsers(t *testing.T) {
	f := &fakeKernels{gate: make(chan struct{})} // the pool's start hangs
	m := newFakeManager(t, Config{PoolSize: 1, MaxKernels: 1}, f)
	if err := m.WarmPools().Prewarm([]string{"python"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pool's start", func() bool { ps := m.WarmPools().Stats(); return len(ps) == 1 && ps[0].Starting == 1 })
	f.mu.Lock()
	f.gate = nil // the user's start does not hang
	f.mu.Unlock()

	k, err := m.StartKernel(context.Background(), StartOptions{})
	if err != nil {
		t.Fatalf("a user's kernel while the pool's start holds the only place: %v", err)
	}
	if ps := m.WarmPools().Stats()[0]; ps.Starting != 0 || ps.Ready != 0 {
		t.Errorf("pool %+v, want its start stopped", ps)
	}
	if _, err := m.StartKernel(context.Background(), StartOptions{}); !errors.Is(err, ErrTooManyKernels) {
		t.Errorf("a second kernel under MaxKernels 1: %v, want ErrTooManyKernels", err)
	}
	// The pool does not take the place back while the user's kernel holds it.
	m.WarmPools().Prewarm([]string{"python"})
	if ps := m.WarmPools().Stats()[0]; ps.Starting != 0 || ps.Ready != 0 {
		t.Errorf("pool %+v refilled past the limit", ps)
	}
	// Once the kernel is gone, the place is the pool's again.
	if err := m.ShutdownKernel(context.Background(), k.ID()); err != nil {
		t.Fatal(err)
	}
	m.WarmPools().Prewarm([]string{"python"})
	waitFor(t, "the pool to refill", func() bool { return m.WarmPools().Stats()[0].Ready == 1 })
}

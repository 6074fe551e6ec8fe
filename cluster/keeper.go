package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"kernelgate/state"
)

// Keeper holds this replica's leases on kernels: it acquires them,
// renews them all in one statement every Lease/3, and tells its owner,
// through the lost callback, of each lease it no longer holds: taken by
// another replica, lapsed, or not renewed in time (the database did not
// answer, or this process was paused past the lease: a long GC pause,
// SIGSTOP, a partition). A lost lease is forgotten: the keeper never
// renews it nor hands it out again, and the store refuses writes under
// its epoch; acting for the kernel again takes a new Acquire (a new
// epoch).
//
// The keeper's clock for "in time" is this process's monotonic clock,
// counted from when a renewal was sent, so it never believes a lease
// longer than the store does; the store decides with its own clock.
type Keeper struct {
	store  Store
	cfg    Config
	onLost func(lost []state.Fence)

	mu   sync.Mutex
	held map[string]heldLease // by kernel

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// heldLease is a lease as the keeper holds it.
type heldLease struct {
	fence state.Fence
	// until is when it lapses as far as this process knows: the
	// sending of its last acquisition or renewal, plus the lease.
	until time.Time
}

// NewKeeper starts a keeper of this replica's leases. onLost (nil: none)
// is called with the leases lost, on the keeper's goroutine, holding no
// lock of the keeper (it may call the keeper); it should not block long:
// the next renewal waits for it.
func NewKeeper(store Store, cfg Config, onLost func(lost []state.Fence)) (*Keeper, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if store.Replica() == "" {
		return nil, state.ErrNotReplica
	}
	if onLost == nil {
		onLost = func([]state.Fence) {}
	}
	k := &Keeper{store: store, cfg: cfg, onLost: onLost, held: map[string]heldLease{},
		stop: make(chan struct{}), done: make(chan struct{})}
	go k.run()
	return k, nil
}

// Acquire takes the kernel's lease for this replica, under a new epoch
// (state.Postgres.AcquireLease), and keeps it renewed. When another
// replica holds it, it returns that lease and state.ErrLeaseHeld.
func (k *Keeper) Acquire(ctx context.Context, kernel string) (state.Lease, error) {
	sent := time.Now()
	l, err := k.store.AcquireLease(ctx, kernel, k.cfg.Lease)
	if err != nil {
		return l, err
	}
	k.hold(l.Fence(), sent)
	return l, nil
}

// Adopt starts keeping a lease another replica handed to this one
// (TransferLease): it renews it at once and returns it. state.ErrNoLease
// or state.ErrLeaseHeld when this replica does not hold it.
func (k *Keeper) Adopt(ctx context.Context, kernel string) (state.Lease, error) {
	l, err := k.store.LeaseOwner(ctx, kernel)
	if err != nil {
		return state.Lease{}, err
	}
	if l.Owner != k.store.Replica() {
		return l, fmt.Errorf("%w: kernel %s (owner %s)", state.ErrLeaseHeld, kernel, l.Owner)
	}
	sent := time.Now()
	still, err := k.store.RenewLeases(ctx, []state.Fence{l.Fence()}, k.cfg.Lease)
	if err != nil {
		return state.Lease{}, err
	}
	if len(still) != 1 {
		return state.Lease{}, fmt.Errorf("%w: kernel %s", state.ErrNoLease, kernel)
	}
	k.hold(l.Fence(), sent)
	return l, nil
}

func (k *Keeper) hold(f state.Fence, sent time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if h, ok := k.held[f.Kernel]; ok && h.fence.Epoch > f.Epoch {
		return // a newer term is already held
	}
	k.held[f.Kernel] = heldLease{f, sent.Add(k.cfg.Lease)}
}

// Fence returns the fence to write the kernel's records under, while
// this replica holds its lease (false otherwise: it must not act for
// the kernel).
func (k *Keeper) Fence(kernel string) (state.Fence, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	h, ok := k.held[kernel]
	if !ok || !time.Now().Before(h.until) {
		return state.Fence{}, false
	}
	return h.fence, true
}

// Held returns the leases held, ordered by kernel.
func (k *Keeper) Held() []state.Fence {
	k.mu.Lock()
	out := make([]state.Fence, 0, len(k.held))
	for _, h := range k.held {
		out = append(out, h.fence)
	}
	k.mu.Unlock()
	slices.SortFunc(out, func(a, b state.Fence) int { return strings.Compare(a.Kernel, b.Kernel) })
	return out
}

// take removes the kernel's lease from those kept and returns it.
func (k *Keeper) take(kernel string) (heldLease, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	h, ok := k.held[kernel]
	delete(k.held, kernel)
	return h, ok
}

// Release gives the kernel's lease up (the kernel is free for any
// replica) and stops keeping it. Releasing a lease not held does
// nothing.
func (k *Keeper) Release(ctx context.Context, kernel string) error {
	h, ok := k.take(kernel)
	if !ok {
		return nil
	}
	return k.store.ReleaseLease(ctx, h.fence)
}

// Handover hands the kernel's lease to the live replica `to` under the
// next epoch and stops keeping it; `to` then Adopts it. When `to` is not
// live (state.ErrNoReplica) or the store did not answer, the lease is
// kept as it was. state.ErrNoLease when this replica does not hold it.
func (k *Keeper) Handover(ctx context.Context, kernel, to string) (state.Lease, error) {
	h, ok := k.take(kernel)
	if !ok {
		return state.Lease{}, fmt.Errorf("%w: kernel %s is not held here", state.ErrNoLease, kernel)
	}
	l, err := k.store.TransferLease(ctx, h.fence, to, k.cfg.Lease)
	if err != nil && !errors.Is(err, state.ErrFenced) {
		// Still ours as far as we know: the next renewal tells.
		k.mu.Lock()
		if _, again := k.held[kernel]; !again {
			k.held[kernel] = h
		}
		k.mu.Unlock()
	}
	return l, err
}

// run renews the leases every Lease/3 until Close.
func (k *Keeper) run() {
	defer close(k.done)
	tick := time.NewTicker(k.cfg.Lease / 3)
	defer tick.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-tick.C:
		}
		if lost := k.renew(); len(lost) > 0 {
			k.cfg.Logger.Warn("cluster: kernel leases lost", "replica", k.store.Replica(), "count", len(lost), "leases", fmt.Sprint(lost))
			k.onLost(lost)
		}
	}
}

// renew renews the leases still in time, in one statement, and returns
// those lost: out of time before it (this process was paused, or
// renewals failed for a lease), not renewed by the store (taken,
// lapsed), or renewed too late to count (the answer came after the
// lease had run out).
func (k *Keeper) renew() []state.Fence {
	now := time.Now()
	var lost, renew []state.Fence
	first := now.Add(k.cfg.Lease) // when the first of those renewed lapses
	k.mu.Lock()
	for kernel, h := range k.held {
		if now.Before(h.until) {
			renew = append(renew, h.fence)
			if h.until.Before(first) {
				first = h.until
			}
		} else {
			lost = append(lost, h.fence)
			delete(k.held, kernel)
		}
	}
	k.mu.Unlock()
	if len(renew) == 0 {
		return lost
	}
	// Waiting past the first lapse would only delay its report: what
	// is not renewed by then is lost.
	ctx, cancel := context.WithDeadline(context.Background(), first)
	still, err := k.store.RenewLeases(ctx, renew, k.cfg.Lease)
	cancel()
	back := time.Now()
	if err != nil {
		k.cfg.Logger.Warn("cluster: renewing leases failed", "replica", k.store.Replica(), "err", err)
	}
	renewed := map[state.Fence]bool{}
	for _, f := range still {
		renewed[f] = true
	}
	until := now.Add(k.cfg.Lease)
	k.mu.Lock()
	for _, f := range renew {
		h, ok := k.held[f.Kernel]
		if !ok || h.fence != f {
			continue // released, handed over or acquired again meanwhile
		}
		switch {
		case err != nil && back.Before(h.until):
			// Not answered; still in time: the next tick tries again.
		case err == nil && renewed[f] && back.Before(until):
			k.held[f.Kernel] = heldLease{f, until}
		default:
			lost = append(lost, f)
			delete(k.held, f.Kernel)
		}
	}
	k.mu.Unlock()
	return lost
}

// Close stops renewing. The leases are not released: they lapse within
// the lease, unless released or handed over first. Idempotent.
func (k *Keeper) Close() {
	k.closeOnce.Do(func() { close(k.stop) })
	<-k.done
}

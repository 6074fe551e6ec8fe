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
// through the lost callback, of each lease the store says it no longer
// holds: taken by another replica, or lapsed. A lost lease is forgotten:
// the keeper never renews it nor hands it out again, and the store
// refuses writes under its epoch; acting for the kernel again takes a
// new Acquire (a new epoch).
//
// A lease not renewed in time for want of an answer (the database
// stopped or cut off, this process paused past the lease: a long GC
// pause, SIGSTOP) is not lost but unconfirmed: Fence says false (the
// replica must not act for the kernel), Term still gives its fence
// (writes under it are queued, and the store commits them only if the
// term still holds), and the keeper goes on renewing it: the first
// answer confirms it again under the same epoch (nobody took it: the
// store's clock does not run while no replica reaches it, pgschema/0003)
// or reports it lost.
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
	// unconfirmed: until has passed without an answer of the store; it
	// was said in the log.
	unconfirmed bool
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
// (TransferLease, PassLease): it adopts it in the store, renewed, and
// returns it. state.ErrNoLease or state.ErrLeaseHeld when this replica
// does not hold it, state.ErrReplicaLeaving when it is leaving.
func (k *Keeper) Adopt(ctx context.Context, kernel string) (state.Lease, error) {
	l, err := k.store.LeaseOwner(ctx, kernel)
	if err != nil {
		return state.Lease{}, err
	}
	if l.Owner != k.store.Replica() {
		return l, fmt.Errorf("%w: kernel %s (owner %s)", state.ErrLeaseHeld, kernel, l.Owner)
	}
	sent := time.Now()
	if err := k.store.AdoptLease(ctx, l.Fence(), k.cfg.Lease); err != nil {
		return state.Lease{}, err
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
	k.held[f.Kernel] = heldLease{fence: f, until: sent.Add(k.cfg.Lease)}
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

// Term returns the fence of the kernel's term this replica holds,
// confirmed in time or not (Fence): writes under it are committed only
// if the store still says it holds. False once the lease is lost,
// released or handed over.
func (k *Keeper) Term(kernel string) (state.Fence, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	h, ok := k.held[kernel]
	return h.fence, ok
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

// renew renews every lease held, in one statement, and returns those
// lost: not renewed by the store (taken, lapsed). A lease the store did
// not answer for before it ran out by this process's clock, or answered
// for too late to count, is unconfirmed (Fence is false) until a later
// renewal is answered in time.
func (k *Keeper) renew() []state.Fence {
	now := time.Now()
	var renew []state.Fence
	k.mu.Lock()
	for _, h := range k.held {
		renew = append(renew, h.fence)
	}
	k.mu.Unlock()
	if len(renew) == 0 {
		return nil
	}
	// A renewal waits at most half a lease: the next tick tries again.
	ctx, cancel := context.WithTimeout(context.Background(), k.cfg.Lease/2)
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
	var lost, unconfirmed, confirmed []state.Fence
	k.mu.Lock()
	for _, f := range renew {
		h, ok := k.held[f.Kernel]
		if !ok || h.fence != f {
			continue // released, handed over or acquired again meanwhile
		}
		switch {
		case err == nil && !renewed[f]:
			lost = append(lost, f)
			delete(k.held, f.Kernel)
		case err == nil && back.Before(until):
			if h.unconfirmed {
				confirmed = append(confirmed, f)
			}
			k.held[f.Kernel] = heldLease{fence: f, until: until}
		case !back.Before(h.until) && !h.unconfirmed:
			// Not answered, or answered too late, and out of time.
			h.unconfirmed = true
			k.held[f.Kernel] = h
			unconfirmed = append(unconfirmed, f)
		}
	}
	k.mu.Unlock()
	if len(unconfirmed) > 0 {
		k.cfg.Logger.Warn("cluster: kernel leases not renewed in time: this replica does not act for their kernels until the database confirms them",
			"replica", k.store.Replica(), "count", len(unconfirmed), "leases", fmt.Sprint(unconfirmed))
	}
	if len(confirmed) > 0 {
		k.cfg.Logger.Info("cluster: kernel leases confirmed again by the database, under the same epochs", "replica", k.store.Replica(), "count", len(confirmed), "leases", fmt.Sprint(confirmed))
	}
	return lost
}

// Close stops renewing. The leases are not released: they lapse within
// the lease, unless released or handed over first. Idempotent.
func (k *Keeper) Close() {
	k.closeOnce.Do(func() { close(k.stop) })
	<-k.done
}

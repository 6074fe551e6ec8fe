package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"kernelgate/state"
)

// Replica is a gateway's part among the replicas of one store: its row
// in the membership (Member) and the keeper of its kernel leases
// (Keeper). It is what sessions.Ownership asks for.
type Replica struct {
	store  Store
	member *Member
	keeper *Keeper
	lease  time.Duration
}

// Start makes this process a replica: it starts keeping its leases
// (onLost told of those lost, as NewKeeper) and joins the membership
// (Join). Leave undoes it.
func Start(store Store, cfg Config, onLost func([]state.Fence)) (*Replica, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	keeper, err := NewKeeper(store, cfg, onLost)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	member, err := Join(ctx, store, cfg)
	if err != nil {
		keeper.Close()
		return nil, fmt.Errorf("joining the replicas: %w", err)
	}
	return &Replica{store: store, member: member, keeper: keeper, lease: cfg.Lease}, nil
}

// URL is this replica's advertised URL.
func (r *Replica) URL() string { return r.member.URL() }

// Replicas are the live replicas' URLs.
func (r *Replica) Replicas() []string {
	live := r.member.Live()
	out := make([]string, 0, len(live))
	for _, l := range live {
		out = append(out, l.URL)
	}
	return out
}

// Acquire takes the kernel's lease.
func (r *Replica) Acquire(ctx context.Context, kernel string) (state.Fence, error) {
	l, err := r.keeper.Acquire(ctx, kernel)
	if err != nil {
		return state.Fence{}, err
	}
	return l.Fence(), nil
}

// Lease is how long a lease lives without a renewal.
func (r *Replica) Lease() time.Duration { return r.lease }

// Fence is the fence of the kernel's term this replica holds, confirmed
// in time or not (Keeper.Term): the store commits the writes under it
// only while the term holds.
func (r *Replica) Fence(kernel string) (state.Fence, bool) { return r.keeper.Term(kernel) }

// Confirmed says the kernel's lease is held and was renewed in time
// (Keeper.Fence): false while the database does not answer past the
// lease, when the replica must not act for the kernel.
func (r *Replica) Confirmed(kernel string) bool {
	_, ok := r.keeper.Fence(kernel)
	return ok
}

// Release gives the kernel's lease up.
func (r *Replica) Release(ctx context.Context, kernel string) error {
	return r.keeper.Release(ctx, kernel)
}

// Free returns the kernels with a record whose lease no replica holds
// (released, or lapsed), for this one to take over.
func (r *Replica) Free(ctx context.Context) ([]string, error) { return r.store.FreeKernels(ctx) }

// Member is the replica's membership.
func (r *Replica) Member() *Member { return r.member }

// Keeper is the keeper of the replica's leases.
func (r *Replica) Keeper() *Keeper { return r.keeper }

// Leave stops renewing and leaves the membership, within ctx; the
// leases not released lapse within the lease.
func (r *Replica) Leave(ctx context.Context) error {
	r.keeper.Close()
	err := r.member.Close(ctx)
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

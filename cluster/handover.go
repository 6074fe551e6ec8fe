package cluster

import (
	"context"

	"kernelgate/state"
)

// Peers are the live replicas other than this one that are not leaving,
// read from the store now (the membership's own view may be a heartbeat
// old), ordered by id: those a kernel can be handed over to.
func (r *Replica) Peers(ctx context.Context) ([]state.Replica, error) {
	live, err := r.store.Heartbeat(ctx, r.member.URL(), r.lease)
	if err != nil {
		return nil, err
	}
	var out []state.Replica
	for _, l := range live {
		if l.ID != r.member.ID() && !l.Leaving {
			out = append(out, l)
		}
	}
	return out, nil
}

// MarkLeaving marks this replica leaving in the store
// (state.Postgres.MarkLeaving): no lease is handed to it from then on,
// and it adopts none.
func (r *Replica) MarkLeaving(ctx context.Context) error { return r.store.MarkLeaving(ctx) }

// Handover hands the kernel's lease to the live replica `to` under the
// next epoch (Keeper.Handover) and returns it; `to` then adopts it
// (Adopt).
func (r *Replica) Handover(ctx context.Context, kernel, to string) (state.Lease, error) {
	return r.keeper.Handover(ctx, kernel, to)
}

// PassOn passes the lease l, handed to a replica that did not adopt it,
// on to the live replica `to` (state.Postgres.PassLease) and returns it.
func (r *Replica) PassOn(ctx context.Context, l state.Lease, to string) (state.Lease, error) {
	return r.store.PassLease(ctx, l.Fence(), l.Owner, to, r.lease)
}

// Adopt starts keeping a lease another replica handed to this one
// (Keeper.Adopt) and returns its fence; state.ErrLeaseHeld or
// state.ErrNoLease when this replica does not hold it.
func (r *Replica) Adopt(ctx context.Context, kernel string) (state.Fence, error) {
	l, err := r.keeper.Adopt(ctx, kernel)
	if err != nil {
		return state.Fence{}, err
	}
	return l.Fence(), nil
}

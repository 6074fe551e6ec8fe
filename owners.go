package main

import (
	"context"
	"errors"

	"kernelgate/gateway"
	"kernelgate/sessions"
	"kernelgate/state"
)

// owners answers which replica owns what a request names
// (gateway.Owners): what this replica serves is its own; otherwise the
// holder of the lease of the kernel it belongs to, as the store says (a
// context → its kernel, a run → its context's kernel, a session → its
// kernel, a sandbox → its default context's kernel). What is unknown is
// answered here (404, or taken); a kernel no replica holds, or handed to
// this one, is taken over here first (sessions.Manager.AdoptKernel).
type owners struct {
	mgr   *sessions.Manager
	store *state.Postgres
}

// Owner implements gateway.Owners.
func (o owners) Owner(ctx context.Context, kind gateway.Kind, id string) (string, bool, error) {
	of := ""
	switch kind {
	case gateway.KindKernel:
		if _, err := o.mgr.Kernel(id); here(err) {
			return "", true, nil
		}
		of = state.OfKernel
	case gateway.KindContext:
		if _, err := o.mgr.Context(id); here(err) {
			return "", true, nil
		}
		of = state.OfContext
	case gateway.KindSession:
		of = state.OfSession
	case gateway.KindRun:
		of = state.OfRun
	case gateway.KindSandbox:
		// A sandbox lives with its default context (e2b's
		// "e2b-<sandbox>-python"), made with the sandbox.
		id, of = "e2b-"+id+"-python", state.OfContext
		if _, err := o.mgr.Context(id); here(err) {
			return "", true, nil
		}
	default:
		return "", true, nil
	}
	l, err := o.store.OwnerOf(ctx, of, id)
	switch {
	case errors.Is(err, state.ErrNoLease):
		return o.free(ctx, of, id)
	case err != nil:
		return "", false, err
	case l.Owner == o.store.Replica():
		// Here (being handed over, perhaps), or handed to this replica
		// (or taken) and not taken over here yet: taken over now, for
		// this request, unless this replica is leaving (refused: its
		// giver passes the lease on).
		if err := o.mgr.AdoptKernel(ctx, l.Kernel); err != nil {
			return o.again(ctx, of, id, err)
		}
		return "", true, nil
	}
	return l.OwnerURL, false, nil
}

// here reports whether a lookup in this replica's manager found what it
// asked for, or found it being handed over (the handler waits for that
// and sends the request on: gateway's sendOnIfMoved).
func here(err error) bool {
	var moved *sessions.MovedError
	return err == nil || errors.As(err, &moved)
}

// free answers for what belongs to a kernel no replica holds (its lease
// released, or lapsed: its owner stopped, died or froze): this replica
// takes the kernel over now rather than answer 404 until the failover
// scan. What is unknown is answered here.
func (o owners) free(ctx context.Context, of, id string) (string, bool, error) {
	kernel, err := o.store.FreeKernelOf(ctx, of, id)
	if err != nil {
		return "", true, nil
	}
	if err := o.mgr.AdoptKernel(ctx, kernel); err != nil {
		if errors.Is(err, sessions.ErrNoSuchKernel) {
			return "", true, nil // not to be taken over here: answered as unknown
		}
		return o.again(ctx, of, id, err)
	}
	return "", true, nil
}

// again asks the store once more after this replica could not take a
// kernel over: another replica took it meanwhile (the request goes
// there), or this one is stopping.
func (o owners) again(ctx context.Context, of, id string, adoptErr error) (string, bool, error) {
	l, err := o.store.OwnerOf(ctx, of, id)
	switch {
	case err == nil && l.Owner != o.store.Replica():
		return l.OwnerURL, false, nil
	case errors.Is(err, state.ErrNoLease), err == nil:
		return "", false, adoptErr
	}
	return "", false, err
}

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
// kernel, a sandbox → its default context's kernel). What is unknown, or
// whose kernel no replica holds, is answered here (404, or taken).
type owners struct {
	mgr   *sessions.Manager
	store *state.Postgres
}

// Owner implements gateway.Owners.
func (o owners) Owner(ctx context.Context, kind gateway.Kind, id string) (string, bool, error) {
	of := ""
	switch kind {
	case gateway.KindKernel:
		if _, err := o.mgr.Kernel(id); err == nil {
			return "", true, nil
		}
		of = state.OfKernel
	case gateway.KindContext:
		if _, err := o.mgr.Context(id); err == nil {
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
		if _, err := o.mgr.Context(id); err == nil {
			return "", true, nil
		}
	default:
		return "", true, nil
	}
	l, err := o.store.OwnerOf(ctx, of, id)
	switch {
	case errors.Is(err, state.ErrNoLease):
		return "", true, nil
	case err != nil:
		return "", false, err
	case l.Owner == o.store.Replica():
		return "", true, nil
	}
	return l.OwnerURL, false, nil
}

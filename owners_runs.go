package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"kernelgate/gateway"
	"kernelgate/runs"
	"kernelgate/sessions"
	"kernelgate/state"
)

var _ gateway.Leases = owners{}

// Holder implements gateway.Leases: the lease of the kernel kind id
// belongs to, as the store says now.
func (o owners) Holder(ctx context.Context, kind gateway.Kind, id string) (gateway.Holding, error) {
	of := ""
	switch kind {
	case gateway.KindKernel:
		of = state.OfKernel
	case gateway.KindContext:
		of = state.OfContext
	case gateway.KindSession:
		of = state.OfSession
	case gateway.KindRun:
		of = state.OfRun
	case gateway.KindSandbox:
		id, of = "e2b-"+id+"-python", state.OfContext
	default:
		return gateway.Holding{}, nil
	}
	l, err := o.store.OwnerOf(ctx, of, id)
	switch {
	case errors.Is(err, state.ErrNoLease):
		return gateway.Holding{}, nil
	case err != nil:
		return gateway.Holding{}, err
	}
	return gateway.Holding{Held: true, Local: l.Owner == o.store.Replica(), URL: l.OwnerURL, Kernel: l.Kernel, Epoch: l.Epoch}, nil
}

// Lease implements gateway.Leases.
func (o owners) Lease() time.Duration { return o.mgr.Lease() }

// RecordRun implements gateway.Leases: the run's record, queued, as its
// owner would write it (runs.Record), its kernel and language read from
// its context's record in the same statement, written without a fence
// (this replica does not own the kernel; the owner's writes are fenced)
// and never over a record the owner wrote already.
func (o owners) RecordRun(ctx context.Context, id string, run gateway.ForwardedRun) error {
	rec := runs.Record{Context: run.Context, Code: run.Code, Stdin: run.Stdin,
		Created: run.Accepted, State: runs.RunQueued, Forwarded: true}
	if run.Timeout > 0 {
		rec.Deadline = run.Accepted.Add(run.Timeout)
	}
	if run.Command {
		rec.Kind = runs.RecordCommand
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	err = o.store.RecordForwardedRun(ctx, id, run.Context, data)
	if errors.Is(err, state.ErrNoSuchContext) {
		return fmt.Errorf("%w: %s", sessions.ErrNoSuchContext, run.Context)
	}
	return err
}

// DropRun implements gateway.Leases.
func (o owners) DropRun(ctx context.Context, id string) error {
	return o.store.DropQueuedRun(ctx, id)
}

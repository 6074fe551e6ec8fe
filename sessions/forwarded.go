package sessions

import (
	"fmt"
	"time"

	"kernelgate/runs"
)

// Runs forwarded between replicas. A replica that accepts a run for a
// context another replica owns records it in the store, queued, under an
// id it gives it, before forwarding it (gateway/replicas_runs.go); the
// owner runs it under that id (Forwarded), committing the record naming
// its request before its code goes; a replica that takes the kernel over
// follows it if it was sent, sends it if its owner recorded it queued
// (restoration.runs), or runs it when the forwarding replica asks for it
// by its id: the run is neither lost nor run twice.

// Forwarded says a run was accepted and recorded by another replica
// (ExecuteRequest.Forwarded, CommandRequest.Forwarded).
type Forwarded struct {
	// ID is the run's id, given by the replica that accepted it.
	ID string
	// Accepted is when that replica accepted it: the run's timeout
	// counts from then.
	Accepted time.Time
}

// Lease is how long a kernel's lease lives without renewal among
// replicas; 0 for a single gateway.
func (m *Manager) Lease() time.Duration {
	if m.cfg.Ownership == nil {
		return 0
	}
	return m.cfg.Ownership.Lease()
}

// ownsKernel is nil while this replica holds the kernel's lease (always,
// for a single gateway); else an error wrapping runs.ErrNotSent: the
// last check before a run's code goes to the kernel.
func (m *Manager) ownsKernel(kernel string) error {
	o := m.cfg.Ownership
	if o == nil {
		return nil
	}
	if _, ok := o.Fence(kernel); !ok {
		return fmt.Errorf("%w: the lease of kernel %s is not held", runs.ErrNotSent, kernel)
	}
	return nil
}

// forwardedRun makes the run of req on c, or, for a run forwarded under
// an id already known here (its forward tried again, or the run taken
// over with its kernel), returns that run and true.
func (c *Context) forwardedRun(req ExecuteRequest, f Forwarded) (*runs.Run, bool, error) {
	if f.ID == "" {
		return c.newRun("", req), false, nil
	}
	spec := c.runSpec("", req)
	spec.ID, spec.Recorded, spec.Created = f.ID, true, f.Accepted
	if req.Timeout > 0 && !f.Accepted.IsZero() {
		spec.Deadline = f.Accepted.Add(req.Timeout)
	}
	r, existed := c.m.runs.NewOrGet(spec)
	if existed && r.Context != c.ID {
		return nil, false, errorf(ErrBadRequest, "run %s is a run of context %s, not %s", f.ID, r.Context, c.ID)
	}
	return r, existed, nil
}

// knownRun returns the run of a forwarded id this replica knows already.
func (m *Manager) knownRun(f Forwarded) (*runs.Run, bool) {
	if f.ID == "" {
		return nil, false
	}
	r, err := m.runs.Get(f.ID)
	return r, err == nil
}

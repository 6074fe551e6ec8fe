package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"sync"

	"kernelgate/jupyter"
	"kernelgate/state"
)

// Among replicas, a kernel that runs on another host (a local kernel,
// adopted by its pid: jupyter.Locator) is left to the replicas of its
// host: a replica elsewhere that acquired its lease to take it over
// (failover, or a start) gives the lease back at once and leaves the
// kernel's records (kernel, contexts, Jupyter sessions, runs) untouched
// in the store, and never acquires it again. A single gateway restoring
// a store moved from another machine treats such a kernel as before: it
// cannot be adopted, and its contexts' next runs start new kernels.

// elsewhereKernels are the kernels this manager found to run on another
// host.
type elsewhereKernels struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (e *elsewhereKernels) add(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ids == nil {
		e.ids = map[string]bool{}
	}
	e.ids[id] = true
}

func (e *elsewhereKernels) has(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ids[id]
}

// leaveElsewhere takes out of snap the kernels that run on another host,
// with their contexts, Jupyter sessions and runs, and releases their
// leases. Only among replicas.
func (rt restoration) leaveElsewhere(ctx context.Context, snap *state.Snapshot) {
	m := rt.m
	loc, ok := m.prov.(jupyter.Locator)
	if m.cfg.Ownership == nil || !ok {
		return
	}
	gone := map[string]bool{}
	kernels := snap.Kernels[:0]
	for _, rec := range snap.Kernels {
		info, err := jupyter.UnmarshalProvisionerInfo(rec.ProvisionerInfo)
		if err == nil {
			if err := loc.Locate(info); errors.Is(err, jupyter.ErrElsewhere) {
				gone[rec.ID] = true
				m.elsewhere.add(rec.ID)
				m.log.Warn("kernel left to the replicas of its host: this replica runs elsewhere and never adopts a local kernel by its pid", "kernel", rec.ID, "err", err)
				m.disown(ctx, rec.ID)
				continue
			}
		}
		kernels = append(kernels, rec)
	}
	if len(gone) == 0 {
		return
	}
	snap.Kernels = kernels
	theirs := map[string]bool{}
	contexts := snap.Contexts[:0]
	for _, rec := range snap.Contexts {
		if gone[rec.KernelID] {
			theirs[rec.ID] = true
			continue
		}
		contexts = append(contexts, rec)
	}
	snap.Contexts = contexts
	sessions := snap.Sessions[:0]
	for _, rec := range snap.Sessions {
		if !gone[rec.KernelID] {
			sessions = append(sessions, rec)
		}
	}
	snap.Sessions = sessions
	runs := snap.Runs[:0]
	for _, rec := range snap.Runs {
		var of struct {
			Context string `json:"context"`
			Kernel  string `json:"kernel"`
		}
		if json.Unmarshal(rec.Data, &of) == nil && (theirs[of.Context] || gone[of.Kernel]) {
			continue
		}
		runs = append(runs, rec)
	}
	snap.Runs = runs
}

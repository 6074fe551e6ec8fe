package e2b

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Among replicas (Config.Owned set, with a store) a sandbox lives with
// its default context's kernel: the replica that owns that kernel serves
// the sandbox and runs its timeout. When a replica takes a kernel over
// (its owner died, froze, or let it go), it finds, every takeoverEvery,
// the default contexts it now has whose sandbox it does not: it reads
// their records and takes the sandboxes over, timers included (a timeout
// that ran out meanwhile kills the sandbox at once). A replica that finds
// at its sandbox's timeout that another owns it now forgets it here
// (nothing is deleted), so that it reads it afresh if it owns it again.

// takeoverEvery is how often the default contexts are looked over.
const takeoverEvery = 2 * time.Second

// takeovers is the handler's part in taking sandboxes over.
type takeovers struct {
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
	killing  map[string]bool // sandboxes being killed; guarded by Handler.mu
}

// watchTakeovers looks for sandboxes to take over until Close.
func (h *Handler) watchTakeovers() {
	defer close(h.takeovers.done)
	t := time.NewTicker(takeoverEvery)
	defer t.Stop()
	for {
		select {
		case <-h.takeovers.stop:
			return
		case <-t.C:
		}
		h.takeOver(context.Background())
	}
}

// stopTakeovers stops watchTakeovers (if it runs) and waits for it.
func (h *Handler) stopTakeovers() {
	if h.takeovers.stop == nil {
		return
	}
	h.takeovers.stopOnce.Do(func() { close(h.takeovers.stop) })
	<-h.takeovers.done
}

// takeOver takes over the sandboxes whose default context this replica
// has and whose sandbox it does not serve.
func (h *Handler) takeOver(ctx context.Context) {
	var missing []string
	for _, c := range h.mgr.Contexts() {
		id, ok := sandboxOf(c.ID)
		if ok && c.ID == contextPrefix(id)+"python" && h.sandbox(id) == nil {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	snap, err := h.store.Load(ctx)
	if err != nil {
		h.cfg.Logger.Warn("e2b sandboxes of kernels taken over not read: tried again", "sandboxes", len(missing), "err", err)
		return
	}
	for _, rec := range snap.Sandboxes {
		if !slices.Contains(missing, rec.ID) {
			continue
		}
		if owned, err := h.owned(ctx, rec.ID); err != nil || !owned {
			continue
		}
		if _, err := h.mgr.Context(contextPrefix(rec.ID) + "python"); err != nil {
			continue // killed meanwhile
		}
		sb := sandboxFromRecord(rec)
		if sb.ws, err = h.mgr.CreateWorkspace("sandboxes/"+rec.ID, h.workspaceLanguage()); err != nil {
			h.cfg.Logger.Warn("e2b sandbox not taken over: its files cannot be opened", "sandbox", rec.ID, "err", err)
			continue
		}
		h.mu.Lock()
		if h.closed || h.sandboxes[sb.id] != nil || h.takeovers.killing[sb.id] {
			h.mu.Unlock()
			continue
		}
		h.sandboxes[sb.id] = sb
		h.armLocked(sb)
		h.mu.Unlock()
		h.cfg.Logger.Info("e2b sandbox taken over with its default context's kernel: its timeout runs here", "sandbox", sb.id, "ends", sb.end)
	}
}

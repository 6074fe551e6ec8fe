package e2b

import (
	"context"
	"errors"
	"strings"
	"time"

	"kernelgate/state"
	"kernelgate/workspace"
)

// This file keeps the sandboxes in the manager's state store, so that a
// gateway started again on it serves the same sandbox ids:
//   - a sandbox's record (state.Sandbox: id, template, metadata, the
//     hashes of its access tokens, start and end) is written, durably,
//     before the call that made or changed it answers (create, a timeout
//     set, a connect), and deleted, first, when it is killed or its
//     timeout runs out;
//   - its contexts are the manager's (ids "e2b-<sandbox>-<name>"), kept
//     and restored with their kernels as every context is; its files are
//     the workspace sandboxes/<id> under the workspace root.
//
// Restore takes the records over at start. With no store nothing of this
// runs, and Close kills the sandboxes as before.

// storeTimeout bounds a durable write.
const storeTimeout = 10 * time.Second

// idBytes is the random part of a sandbox id: "kg" and 20 hex digits.
const idBytes = 10

// maxTokens bounds the token hashes a sandbox keeps: the one of create
// and those connects minted after restarts, the newest.
const maxTokens = 8

// recordWrites orders the writes of a sandbox's record (fields guarded by
// Handler.mu): one at a time, none under a lock.
type recordWrites struct {
	changes uint64        // changes made so far (each bumps it under Handler.mu)
	written uint64        // the changes the last write held
	writing chan struct{} // closed when the write under way ends; nil: none
}

// recordLocked is the sandbox as the store keeps it; h.mu is held.
func (sb *sandbox) recordLocked() state.Sandbox {
	return state.Sandbox{ID: sb.id, Template: sb.template, Metadata: sb.metadata,
		TokenHashes: append([][32]byte(nil), sb.hashes...), Started: sb.started, Ends: sb.end}
}

// save returns once the changes made to the sandbox so far are durable
// (a failure is logged), writing its record if no write did: the API
// answers after it. A caller that finds a write under way waits for it,
// then writes unless that write held its changes. A killed sandbox is not
// written again.
func (h *Handler) save(sb *sandbox) {
	if h.store == nil {
		return
	}
	h.mu.Lock()
	want := sb.rec.changes
	for !sb.gone && sb.rec.written < want {
		if w := sb.rec.writing; w != nil {
			h.mu.Unlock()
			<-w
			h.mu.Lock()
			continue
		}
		done := make(chan struct{})
		sb.rec.writing = done
		rec, holds := sb.recordLocked(), sb.rec.changes
		h.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		err := h.writer(sb.id).PutSandbox(ctx, rec)
		cancel()
		h.mu.Lock()
		sb.rec.writing = nil
		close(done)
		if err != nil {
			h.mu.Unlock()
			h.cfg.Logger.Error("state: e2b sandbox not recorded: a restart of the gateway loses it", "sandbox", sb.id, "err", err)
			return
		}
		sb.rec.written = max(sb.rec.written, holds)
	}
	h.mu.Unlock()
}

// writer is the store's writes of sandbox id's record: among replicas,
// under the fence of its default context's kernel (refused once another
// replica took that kernel over).
func (h *Handler) writer(id string) state.Writer {
	return h.mgr.ContextWriter(contextPrefix(id) + "python")
}

// deleteRecord forgets sandbox id's record.
func (h *Handler) deleteRecord(id string) {
	if h.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if err := h.writer(id).DeleteSandbox(ctx, id); err != nil {
		h.cfg.Logger.Error("state: e2b sandbox record not deleted", "sandbox", id, "err", err)
	}
}

// sandboxFromRecord is a kept sandbox, without its files, its timer or a
// token to hand (only their hashes were kept).
func sandboxFromRecord(rec state.Sandbox) *sandbox {
	return &sandbox{id: rec.ID, template: rec.Template, metadata: rec.Metadata, started: rec.Started,
		hashes: append([][32]byte(nil), rec.TokenHashes...), end: rec.Ends}
}

// validID says id is a sandbox id this endpoint makes.
func validID(id string) bool {
	hex, ok := strings.CutPrefix(id, "kg")
	if !ok || len(hex) != 2*idBytes {
		return false
	}
	for _, c := range hex {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// sandboxOf is the sandbox a context id names, if it names one.
func sandboxOf(contextID string) (string, bool) {
	rest, ok := strings.CutPrefix(contextID, "e2b-")
	if !ok {
		return "", false
	}
	id, _, ok := strings.Cut(rest, "-")
	return id, ok && validID(id)
}

// RestoreReport says what Restore found in the store.
type RestoreReport struct {
	// Restored are the sandboxes served again; Dropped those deleted
	// (their timeout ran out while no gateway ran, or their contexts did
	// not come back).
	Restored, Dropped int
	// Elsewhere are the sandboxes left to the replica that owns them
	// (Config.Owned).
	Elsewhere int
	// Orphans are the contexts deleted whose sandbox has no record (a
	// crash between the two writes of a create or a kill).
	Orphans int
}

// Restore takes over the sandboxes the store kept: call it once, after
// the manager's Restore (which brought their contexts back) and before
// serving. A sandbox comes back with its id, template, metadata, access
// tokens (those handed before work; a connect hands a new one, see
// connectSandbox) and what is left of its timeout; its contexts are those
// the manager restored. One whose timeout ran out while no gateway ran,
// or none of whose contexts came back, is dropped: its contexts, files
// and record are deleted, and the log says which and why. Without a store
// it does nothing.
func (h *Handler) Restore(ctx context.Context) (RestoreReport, error) {
	var rep RestoreReport
	if h.store == nil {
		return rep, nil
	}
	snap, err := h.store.Load(ctx)
	if err != nil {
		return rep, err
	}
	contexts := map[string]int{} // sandbox id: contexts the manager has
	for _, c := range h.mgr.Contexts() {
		if id, ok := sandboxOf(c.ID); ok {
			contexts[id]++
		}
	}
	kept := map[string]bool{}
	now := time.Now()
	for _, rec := range snap.Sandboxes {
		kept[rec.ID] = true
		if validID(rec.ID) {
			// Another replica's sandbox (or one whose owner is unknown
			// now) is its owner's to serve, time out or drop.
			owned, err := h.owned(ctx, rec.ID)
			if err != nil || !owned {
				h.cfg.Logger.Info("e2b sandbox left to the replica that owns it", "sandbox", rec.ID, "err", err)
				rep.Elsewhere++
				continue
			}
		}
		why := ""
		var sb *sandbox
		switch {
		case !validID(rec.ID):
			why = "not a sandbox id of this endpoint"
		case !now.Before(rec.Ends):
			why = "its timeout ran out while no gateway was running"
		case contexts[rec.ID] == 0:
			why = "none of its contexts came back (see the log of the contexts dropped)"
		default:
			sb = sandboxFromRecord(rec)
			if sb.ws, err = h.mgr.CreateWorkspace("sandboxes/"+rec.ID, h.workspaceLanguage()); err != nil {
				why = "its files cannot be opened: " + err.Error()
			}
		}
		if why != "" {
			h.drop(rec.ID, why)
			rep.Dropped++
			continue
		}
		h.mu.Lock()
		h.sandboxes[sb.id] = sb
		h.armLocked(sb)
		h.mu.Unlock()
		rep.Restored++
	}
	for id, n := range contexts {
		if !kept[id] {
			h.cfg.Logger.Warn("e2b sandbox contexts deleted: their sandbox has no record", "sandbox", id, "contexts", n)
			h.drop(id, "")
			rep.Orphans += n
		}
	}
	if len(snap.Sandboxes) > 0 || rep.Orphans > 0 {
		h.cfg.Logger.Info("e2b sandboxes restored", "sandboxes", rep.Restored, "dropped", rep.Dropped, "orphan_contexts", rep.Orphans)
	}
	return rep, nil
}

// drop deletes a kept sandbox that does not come back: its record,
// contexts and files; why is logged (nothing when empty).
func (h *Handler) drop(id, why string) {
	if why != "" {
		h.cfg.Logger.Warn("e2b sandbox dropped", "sandbox", id, "why", why)
	}
	h.deleteRecord(id)
	if !validID(id) {
		return
	}
	h.deleteContexts(id)
	if root := h.mgr.Workspaces(); root != nil {
		ws, err := root.Open("sandboxes/"+id, nil)
		if err == nil {
			err = ws.Delete()
		}
		if err != nil && !errors.Is(err, workspace.ErrNotFound) {
			h.cfg.Logger.Warn("e2b sandbox: workspace not deleted", "sandbox", id, "err", err)
		}
	}
}

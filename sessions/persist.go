package sessions

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"kernelgate/jupyter"
	"kernelgate/state"
)

// This file keeps the manager's records in its state store
// (Config.Store), so that a gateway started again on the same store finds
// its kernels, contexts, Jupyter sessions and runs (restore.go):
//   - a kernel is written, durably, each time a process of it is ready
//     (with how to reach that process again) and deleted when it is shut
//     down; its last activity is written now and then (checkpoint);
//   - a context and a Jupyter session are written, durably, before the
//     call that made or changed them returns, and deleted with them;
//   - runs are written by a runs.Journal over the same store (see
//     package runs): a run's record is committed before its id leaves
//     the gateway, its later writes are queued and never waited for.
//
// With no store (an empty --state-dir) nothing of this runs.

// storeTimeout bounds a durable write, a run's promise included.
const storeTimeout = 10 * time.Second

// kernelExtra is what the manager keeps of a kernel beyond state.Kernel.
type kernelExtra struct {
	Policy restartPolicy `json:"policy"`
	// Env holds the values of the variables it was started with (a
	// restart after the gateway's starts it with them again).
	Env map[string]string `json:"env,omitempty"`
	// Workspace is the name of its workspace in the root, if any.
	Workspace string `json:"workspace,omitempty"`
}

// contextExtra is what the manager keeps of a context beyond
// state.Context.
type contextExtra struct {
	Shared bool `json:"shared,omitempty"`
	// Workspace is the name of its workspace when it shares one
	// (ContextRequest.Workspace); else it is contexts/<id>.
	Workspace string `json:"workspace,omitempty"`
	// Kernelspec is its kernelspec when a request named it (rather than
	// the language's of the table).
	Kernelspec string `json:"kernelspec,omitempty"`
}

// infoProcess is a process that can say how to reach it again (a real
// kernel; not the fakes of tests).
type infoProcess interface {
	ProvisionerInfo() (jupyter.ProvisionerInfo, error)
}

// records keeps the manager's kernels and contexts in its store
// (Config.Store; nil: memory only), and wakes the checkpoint of the
// kernels' last activity.
type records struct {
	store state.Store
	log   *slog.Logger
	cfg   *Config
	// writer gives the writes of a kernel's records (Manager.writer).
	writer func(kernel string) state.Writer
	// active is signalled (without blocking) when a kernel's activity is
	// CheckpointInterval past its record: it wakes the checkpoint.
	active chan struct{}
}

// Store is the store the manager keeps its records in (Config.Store), nil
// when they are kept in memory only. Packages built on the manager (e2b)
// keep their own records of the contexts they make beside them.
func (m *Manager) Store() state.Store { return m.store }

// storeCtx bounds a durable write.
func storeCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), storeTimeout)
}

// kernel is k as the store keeps it, with how to reach jk.
func (rs *records) kernel(k *Kernel, jk process) state.Kernel {
	// env, cwd and ws change once, when a context takes a pooled kernel.
	k.mu.Lock()
	env, cwd, ws := k.env, k.cwd, k.ws
	k.mu.Unlock()
	rec := state.Kernel{ID: k.id, Spec: k.spec.Name, Provisioner: "local", Cwd: cwd, Created: k.created}
	for name := range env {
		rec.EnvNames = append(rec.EnvNames, name)
	}
	ex := kernelExtra{Policy: k.policy, Env: env}
	if ws != nil {
		ex.Workspace = ws.Name()
	}
	rec.Extra, _ = json.Marshal(ex)
	if ip, ok := jk.(infoProcess); ok && jk != nil {
		if info, err := ip.ProvisionerInfo(); err == nil {
			rec.Provisioner = info.Provisioner
			rec.ProvisionerInfo, _ = info.Marshal()
		} else {
			rs.log.Warn("kernel cannot be found again after a restart of the gateway", "kernel", k.id, "err", err)
		}
	}
	k.mu.Lock()
	rec.LastActivity = k.lastAct
	k.mu.Unlock()
	return rec
}

// putKernel records k with its running process jk.
func (rs *records) putKernel(k *Kernel, jk process) {
	if rs.store == nil {
		return
	}
	ctx, cancel := storeCtx()
	defer cancel()
	rec := rs.kernel(k, jk)
	if err := rs.writer(k.id).PutKernel(ctx, rec); err != nil {
		rs.log.Error("state: kernel not recorded: a restart of the gateway loses it", "kernel", k.id, "err", err)
		return
	}
	k.mu.Lock()
	if rec.LastActivity.After(k.recordedAct) {
		k.recordedAct = rec.LastActivity
	}
	k.mu.Unlock()
}

// deleteKernel forgets the record of kernel id.
func (rs *records) deleteKernel(id string) {
	if rs.store == nil {
		return
	}
	ctx, cancel := storeCtx()
	defer cancel()
	if err := rs.writer(id).DeleteKernel(ctx, id); err != nil {
		rs.log.Error("state: kernel record not deleted", "kernel", id, "err", err)
	}
}

// putContext records c (not an isolated run's).
func (rs *records) putContext(c *Context) {
	if rs.store == nil || c.Isolated {
		return
	}
	c.mu.Lock()
	rec := state.Context{ID: c.ID, Language: c.Language, Cwd: c.Cwd, Env: c.Env, Created: c.created, Tokens: c.tokens}
	if c.kernel != nil {
		rec.KernelID = c.kernel.id
	}
	deleted := c.deleted
	c.mu.Unlock()
	if deleted {
		return
	}
	ex := contextExtra{Shared: c.Shared}
	if c.spec != nil && rs.cfg.Languages[c.Language] != c.spec.Name {
		ex.Kernelspec = c.spec.Name
	}
	if c.wsBorrowed && c.ws != nil {
		ex.Workspace = c.ws.Name()
	}
	rec.Extra, _ = json.Marshal(ex)
	ctx, cancel := storeCtx()
	defer cancel()
	if err := rs.writer(rec.KernelID).PutContext(ctx, rec); err != nil {
		rs.log.Error("state: context not recorded: a restart of the gateway loses it", "context", c.ID, "err", err)
	}
}

// deleteContext forgets c's record.
func (rs *records) deleteContext(c *Context) {
	if rs.store == nil || c.Isolated {
		return
	}
	c.mu.Lock()
	kernel := ""
	if c.kernel != nil {
		kernel = c.kernel.id
	}
	c.mu.Unlock()
	ctx, cancel := storeCtx()
	defer cancel()
	if err := rs.writer(kernel).DeleteContext(ctx, c.ID); err != nil {
		rs.log.Error("state: context record not deleted", "context", c.ID, "err", err)
	}
}

// checkpoint writes, now and then, the last activity of the kernels
// whose record is CheckpointInterval or more behind it, so that cull
// timers go on from there after a restart. It sleeps until a kernel's
// activity gets that far ahead of its record (noteActivity), then waits
// CheckpointInterval to gather what follows: idle kernels, and kernels
// whose record is recent (just started), cost no wakeup and no write.
// It returns once closing is closed; kernels lists the kernels.
func (rs *records) checkpoint(closing <-chan struct{}, kernels func() []*Kernel) {
	for {
		select {
		case <-rs.active:
		case <-closing:
			return
		}
		t := time.NewTimer(rs.cfg.CheckpointInterval)
		select {
		case <-t.C:
		case <-closing:
			t.Stop()
			return
		}
		for _, k := range kernels() {
			k.mu.Lock()
			jk, behind, removed := k.jk, k.behindLocked(), k.removed
			k.mu.Unlock()
			if removed || jk == nil || !behind {
				continue
			}
			rs.putKernel(k, jk)
		}
	}
}

// behindLocked reports whether k's record in the store is
// CheckpointInterval or more behind its last activity. k.mu is held.
func (k *Kernel) behindLocked() bool {
	return k.m.store != nil && k.lastAct.Sub(k.recordedAct) >= k.m.cfg.CheckpointInterval
}

// noteActivity wakes the checkpoint: a kernel's record is behind (see
// behindLocked). It never blocks (one signal stands for any number).
func (rs *records) noteActivity() {
	select {
	case rs.active <- struct{}{}:
	default:
	}
}

// leave closes the kernel's clients and its connection to its process,
// leaving the process running and recorded for the next gateway
// (Manager.Detach). Its last activity is written first.
func (k *Kernel) leave() {
	k.cancelAdoption() // a kept kernel not adopted yet stays as it is
	k.life.Lock()
	defer k.life.Unlock()
	jk, ok := k.unhook()
	if !ok || jk == nil {
		return
	}
	k.m.records.putKernel(k, jk)
	if d, ok := jk.(interface{ Detach() }); ok {
		d.Detach()
		return
	}
	jk.Shutdown(context.Background())
}

// unhook marks the kernel removed and takes its process from it, closing
// its clients, without stopping the process; false when it was removed
// already. The caller holds k.life.
func (k *Kernel) unhook() (process, bool) {
	k.mu.Lock()
	if k.removed {
		k.mu.Unlock()
		return nil, false
	}
	k.removed = true
	jk := k.jk
	k.jk = nil
	clients := k.clients
	k.clients = map[*Client]struct{}{}
	k.mu.Unlock()
	for c := range clients {
		c.closeWith(ErrShuttingDown)
	}
	return jk, true
}

// stopRuns ends the context's queued runs as the gateway stops, and its
// running one unless the kernel is kept (keep): the next gateway picks
// that one up.
func (c *Context) stopRuns(keep bool) {
	queued, running := c.runs.Take()
	for _, r := range queued {
		r.Lose(stoppedBeforeStart)
	}
	if running != nil && !keep {
		running.Lose("the gateway stopped during the run and shut its kernel down; the next run starts a new kernel without the earlier state")
	}
}

// ContextToken is a context token as kept: the SHA-256 of the token (never
// the token) and its expiry.
type ContextToken = state.TokenHash

// KeepToken keeps the hash of a token minted for the context, with its
// record: with a store it works after a restart. The context's expired
// tokens are dropped.
func (c *Context) KeepToken(t ContextToken) {
	now := time.Now()
	c.mu.Lock()
	kept := c.tokens[:0:0]
	for _, old := range c.tokens {
		if now.Before(old.Expires) {
			kept = append(kept, old)
		}
	}
	c.tokens = append(kept, t)
	c.mu.Unlock()
	c.m.records.putContext(c)
}

// Tokens are the context tokens kept of the context that have not
// expired: those an earlier gateway minted, after a restart.
func (c *Context) Tokens() []ContextToken {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []ContextToken
	for _, t := range c.tokens {
		if now.Before(t.Expires) {
			out = append(out, t)
		}
	}
	return out
}

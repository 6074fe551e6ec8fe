package sessions

import (
	"context"
	"encoding/json"
	"time"

	"kernelgate/state"
)

// Ownership is this gateway's part among several replicas on one store
// (docs/replicas.md): the leases it holds on kernels. Config.Ownership
// nil is a single gateway: it owns every kernel it has, and nothing of
// this file costs anything.
type Ownership interface {
	// URL is the address the other replicas reach this one at.
	URL() string
	// Replicas are the advertised URLs of the live replicas, this one
	// among them.
	Replicas() []string
	// Acquire takes the kernel's lease for this replica under a new
	// epoch and keeps it renewed; state.ErrLeaseHeld when another
	// replica holds it.
	Acquire(ctx context.Context, kernel string) (state.Fence, error)
	// Fence is the fence to write the kernel's records under while this
	// replica holds its lease; false otherwise.
	Fence(kernel string) (state.Fence, bool)
	// Release gives the kernel's lease up (a kernel shut down, or left
	// running for another replica to adopt).
	Release(ctx context.Context, kernel string) error
	// Lease is how long a lease lives without a renewal.
	Lease() time.Duration
	// Free returns the kernels with a record whose lease no replica
	// holds (released, or lapsed: their owner died or froze).
	Free(ctx context.Context) ([]string, error)
	// Peers are the live replicas other than this one that are not
	// leaving, as the store says now: those a kernel can be handed over
	// to.
	Peers(ctx context.Context) ([]state.Replica, error)
	// MarkLeaving marks this replica leaving in the store: no lease is
	// handed to it from then on, and it adopts none handed to it.
	MarkLeaving(ctx context.Context) error
	// Handover hands the kernel's lease to the live replica of id `to`
	// under the next epoch and returns it; the lease is kept when that
	// fails (state.ErrReplicaLeaving: `to` is leaving).
	Handover(ctx context.Context, kernel, to string) (state.Lease, error)
	// PassOn passes a lease handed to a replica that did not adopt it
	// on to the live replica `to` and returns it; state.ErrNotHanded
	// when its holder adopted it meanwhile.
	PassOn(ctx context.Context, handed state.Lease, to string) (state.Lease, error)
	// Adopt starts keeping the lease of a kernel another replica handed
	// to this one; state.ErrLeaseHeld or state.ErrNoLease otherwise.
	Adopt(ctx context.Context, kernel string) (state.Fence, error)
}

// replicaURL is this replica's advertised URL, or "" for a single
// gateway (the models then carry no "replica").
func (m *Manager) replicaURL() string {
	if m.cfg.Ownership == nil {
		return ""
	}
	return m.cfg.Ownership.URL()
}

// owned keeps of snap what this replica may take over: the kernels whose
// lease it acquires (a new term), and the contexts, Jupyter sessions and
// runs of those kernels; what another replica holds is left to it,
// untouched, in the store. Contexts without a kernel are kept too.
func (rt restoration) owned(ctx context.Context, snap state.Snapshot) state.Snapshot {
	o := rt.m.cfg.Ownership
	others := map[string]bool{} // kernels another replica holds
	var out state.Snapshot
	var held []state.Kernel
	for _, rec := range snap.Kernels {
		if _, err := o.Acquire(ctx, rec.ID); err != nil {
			held = append(held, rec)
			continue
		}
		out.Kernels = append(out.Kernels, rec)
	}
	// A lease held may be a dead replica's (this gateway restarted after
	// a crash): it lapses within one lease unless its holder renews it.
	if len(held) > 0 {
		rt.m.log.Info("waiting one lease for the kernels other replicas held: those not renewed are taken over", "kernels", len(held), "lease", o.Lease())
		select {
		case <-time.After(o.Lease()):
		case <-ctx.Done():
		}
	}
	for _, rec := range held {
		if _, err := o.Acquire(ctx, rec.ID); err != nil {
			others[rec.ID] = true
			rt.m.log.Debug("kernel left to the replica that holds it", "kernel", rec.ID, "err", err)
			continue
		}
		out.Kernels = append(out.Kernels, rec)
	}
	theirs := map[string]bool{} // contexts of those kernels
	for _, rec := range snap.Contexts {
		if others[rec.KernelID] {
			theirs[rec.ID] = true
			continue
		}
		out.Contexts = append(out.Contexts, rec)
	}
	for _, rec := range snap.Sessions {
		if !others[rec.KernelID] {
			out.Sessions = append(out.Sessions, rec)
		}
	}
	out.Sandboxes = snap.Sandboxes
	for _, rec := range snap.Runs {
		var of struct {
			Context string `json:"context"`
			Kernel  string `json:"kernel"`
		}
		if json.Unmarshal(rec.Data, &of) == nil && (theirs[of.Context] || others[of.Kernel]) {
			continue
		}
		out.Runs = append(out.Runs, rec)
	}
	return out
}

// ownTimeout bounds taking a kernel's lease.
const ownTimeout = 10 * time.Second

// own takes the lease of a kernel this replica is about to start or
// adopt, unless it holds it already. A single gateway owns every kernel.
func (m *Manager) own(kernel string) error {
	o := m.cfg.Ownership
	if o == nil {
		return nil
	}
	if _, ok := o.Fence(kernel); ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(m.closingCtx, ownTimeout)
	defer cancel()
	_, err := o.Acquire(ctx, kernel)
	return err
}

// disown gives up the lease of a kernel shut down.
func (m *Manager) disown(ctx context.Context, kernel string) {
	o := m.cfg.Ownership
	if o == nil {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ownTimeout)
	defer cancel()
	if err := o.Release(rctx, kernel); err != nil {
		m.log.Warn("kernel lease not released: it lapses within the lease", "kernel", kernel, "err", err)
	}
}

// writer returns the store's writes of a kernel's records ("": of no
// kernel). Among replicas they go under the kernel's fence: committed
// only while this replica holds its lease, refused (state.ErrFenced)
// once it lost it, even if it wakes up from a pause and writes late.
func (m *Manager) writer(kernel string) state.Writer {
	o := m.cfg.Ownership
	if o == nil || kernel == "" {
		return m.store
	}
	f, ok := o.Fence(kernel)
	if !ok {
		f = state.Fence{Kernel: kernel} // no epoch is 0: every write refused
	}
	return state.Fenced(m.store, f)
}

// LeasesLost is told of the kernel leases this replica no longer holds
// (cluster.Keeper's callback, holding none of its locks): it lets go of
// those kernels without stopping them, for the replica that owns them
// now.
func (m *Manager) LeasesLost(lost []state.Fence) {
	o := m.cfg.Ownership
	for _, f := range lost {
		m.mu.Lock()
		k := m.kernels[f.Kernel]
		m.mu.Unlock()
		if k == nil {
			continue
		}
		if now, ok := o.Fence(f.Kernel); ok && now.Epoch > f.Epoch {
			continue // held again, under a newer term
		}
		m.log.Warn("kernel lease lost: letting the kernel go to the replica that owns it now", "kernel", f.Kernel, "epoch", f.Epoch)
		m.letGo(k, lostLease, "this replica lost the lease of the context's kernel during the command")
	}
}

// lostLease is why a run followed here ends when its kernel's lease is
// lost.
const lostLease = "this replica lost the lease of the context's kernel to another replica, which owns the kernel now; the run's output is no longer followed here"

// letGo forgets k, its contexts and its Jupyter sessions without
// stopping the kernel and without writing to the store: its websocket
// clients are closed, its runs no longer followed nor written (they end
// here saying runWhy), its commands stopped (saying commandWhy), and
// nothing here acts for it again.
func (m *Manager) letGo(k *Kernel, runWhy, commandWhy string) {
	m.mu.Lock()
	if m.kernels[k.id] == k {
		delete(m.kernels, k.id)
		m.freedLocked()
	}
	all := make([]*Context, 0, len(m.contexts))
	for _, c := range m.contexts {
		all = append(all, c)
	}
	m.mu.Unlock()
	var theirs []*Context
	for _, c := range all {
		c.mu.Lock()
		if c.kernel == k {
			c.deleted = true // acts no more: its next run is refused
			theirs = append(theirs, c)
		}
		c.mu.Unlock()
	}
	m.mu.Lock()
	for _, c := range theirs {
		if m.contexts[c.ID] == c {
			delete(m.contexts, c.ID)
		}
	}
	m.mu.Unlock()
	m.jsessions.mu.Lock()
	for id, s := range m.jsessions.byID {
		if s.KernelID == k.id {
			delete(m.jsessions.byID, id)
		}
	}
	m.jsessions.mu.Unlock()
	for _, c := range theirs {
		c.stopCommands(commandWhy)
		queued, running := c.runs.Take()
		if running != nil {
			queued = append(queued, running)
		}
		m.runs.Forget(queued)
		for _, r := range queued {
			r.Lose(runWhy)
		}
	}
	k.letGo()
}

// letGo detaches this process from the kernel's process, which goes on
// running, without recording it.
func (k *Kernel) letGo() {
	k.cancelAdoption()
	k.life.Lock()
	defer k.life.Unlock()
	jk, _ := k.unhook()
	if d, ok := jk.(interface{ Detach() }); ok {
		d.Detach()
	}
}

// failover takes over, every lease/3 until the manager closes, the
// kernels no replica holds (their owner died, froze past its lease, or
// stopped and left them running): started by Restore.
func (m *Manager) failover() {
	t := time.NewTicker(m.cfg.Ownership.Lease() / 3)
	defer t.Stop()
	for {
		select {
		case <-m.closing:
			return
		case <-t.C:
		}
		m.adoptFree(m.closingCtx)
	}
}

// adoptFree acquires the leases of the kernels no replica holds and
// takes them over as a start does: the kernel (the same process, adopted
// again), its contexts, Jupyter sessions and runs.
func (m *Manager) adoptFree(ctx context.Context) {
	o := m.cfg.Ownership
	if m.handing.leaving.Load() {
		return // this replica hands its kernels over: it takes none
	}
	// One takeover at a time (AdoptKernel too): a kernel is taken once.
	m.handing.takeMu.Lock()
	defer m.handing.takeMu.Unlock()
	if m.handing.leaving.Load() {
		return // it began leaving while this waited (HandOver)
	}
	ids, err := o.Free(ctx)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("cluster: could not list the kernels no replica holds", "err", err)
		}
		return
	}
	got := map[string]bool{}
	for _, id := range ids {
		if _, err := m.Kernel(id); err == nil {
			continue // still this replica's here: its lease's loss is on its way
		}
		if m.elsewhere.has(id) {
			continue // a local kernel of another host (elsewhere.go)
		}
		if _, err := o.Acquire(ctx, id); err == nil {
			got[id] = true
		}
	}
	if len(got) == 0 {
		return
	}
	rep, took := m.takeOver(ctx, got)
	if took {
		m.log.Info("cluster: took over kernels no replica held", "kernels", rep.Adopted, "pending", rep.Pending, "lost", rep.Lost, "stopped", rep.Stopped,
			"contexts", rep.Contexts, "sessions", rep.Sessions, "runs", rep.Runs, "picked_up", rep.PickedUp)
	}
}

// takeOver takes over the kernels of got, whose leases this replica has
// just acquired or adopted, as a start does: the kernel (the same
// process, adopted again), its contexts, Jupyter sessions and runs. When
// their records cannot be read their leases are released for another
// replica (took false). The caller holds handing.takeMu.
func (m *Manager) takeOver(ctx context.Context, got map[string]bool) (rep RestoreReport, took bool) {
	t0 := time.Now()
	snap, err := m.store.Load(ctx)
	if err != nil {
		m.log.Warn("cluster: kernels not taken over: their records could not be read; their leases are released for another replica", "kernels", len(got), "err", err)
		for id := range got {
			m.disown(ctx, id)
		}
		return rep, false
	}
	var mine state.Snapshot
	contexts := map[string]bool{}
	for _, rec := range snap.Kernels {
		if got[rec.ID] {
			mine.Kernels = append(mine.Kernels, rec)
		}
	}
	for _, rec := range snap.Contexts {
		if got[rec.KernelID] {
			mine.Contexts = append(mine.Contexts, rec)
			contexts[rec.ID] = true
		}
	}
	for _, rec := range snap.Sessions {
		if got[rec.KernelID] {
			mine.Sessions = append(mine.Sessions, rec)
		}
	}
	for _, rec := range snap.Runs {
		var of struct {
			Context string `json:"context"`
			Kernel  string `json:"kernel"`
		}
		if json.Unmarshal(rec.Data, &of) == nil && (contexts[of.Context] || got[of.Kernel]) {
			mine.Runs = append(mine.Runs, rec)
		}
	}
	rep = restoration{m}.take(ctx, &mine)
	m.log.Debug("cluster: kernels taken over", "kernels", len(got), "took", time.Since(t0).Round(time.Millisecond))
	return rep, true
}

package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"kernelgate/internal/jsonscan"
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
//   - a run's record is committed before its id leaves the gateway
//     (promise), unless its id leaves only with its end (a run its
//     caller waits for, ExecuteRequest.Wait): such a run commits
//     nothing and waits for no commit; its record and events are
//     queued as they change, as below, and listings show it from
//     memory meanwhile. The run next to go on an idle context is committed as
//     its code is sent, naming its kernel and its execute_request: the
//     commit is started and the code goes at once, the disk working
//     while the kernel does; its id, and its end, wait for the commit.
//     A run that waits for its turn or its kernel is committed at once,
//     and again, naming its request, before the kernel gets its code.
//     Commits of runs starting together share an fsync. Later, its record is
//     written when it starts and ends, and its events as they come;
//     those writes are queued by the store and committed together (one
//     fsync for many), and never waited for: while the store's queue is
//     full (a slow or hung disk, state.ErrBusy) the run is behind, its
//     writes wait in the run's own memory, and the catch-up writes them
//     in one go once the store has committed what it had queued. A
//     kernel's reader never waits on the disk.
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

// Store is the store the manager keeps its records in (Config.Store), nil
// when they are kept in memory only. Packages built on the manager (e2b)
// keep their own records of the contexts they make beside them.
func (m *Manager) Store() state.Store { return m.store }

// storeCtx bounds a durable write.
func storeCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), storeTimeout)
}

// kernelRecord is k as the store keeps it, with how to reach jk.
func (m *Manager) kernelRecord(k *Kernel, jk process) state.Kernel {
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
			m.log.Warn("kernel cannot be found again after a restart of the gateway", "kernel", k.id, "err", err)
		}
	}
	k.mu.Lock()
	rec.LastActivity = k.lastAct
	k.mu.Unlock()
	return rec
}

// putKernel records k with its running process jk.
func (m *Manager) putKernel(k *Kernel, jk process) {
	if m.store == nil {
		return
	}
	ctx, cancel := storeCtx()
	defer cancel()
	rec := m.kernelRecord(k, jk)
	if err := m.store.PutKernel(ctx, rec); err != nil {
		m.log.Error("state: kernel not recorded: a restart of the gateway loses it", "kernel", k.id, "err", err)
		return
	}
	k.mu.Lock()
	if rec.LastActivity.After(k.recordedAct) {
		k.recordedAct = rec.LastActivity
	}
	k.mu.Unlock()
}

// deleteKernel forgets k's record.
func (m *Manager) deleteKernel(id string) {
	if m.store == nil {
		return
	}
	ctx, cancel := storeCtx()
	defer cancel()
	if err := m.store.DeleteKernel(ctx, id); err != nil {
		m.log.Error("state: kernel record not deleted", "kernel", id, "err", err)
	}
}

// putContext records c (not an isolated run's).
func (m *Manager) putContext(c *Context) {
	if m.store == nil || c.Isolated {
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
	if c.spec != nil && m.cfg.Languages[c.Language] != c.spec.Name {
		ex.Kernelspec = c.spec.Name
	}
	if c.wsBorrowed && c.ws != nil {
		ex.Workspace = c.ws.Name()
	}
	rec.Extra, _ = json.Marshal(ex)
	ctx, cancel := storeCtx()
	defer cancel()
	if err := m.store.PutContext(ctx, rec); err != nil {
		m.log.Error("state: context not recorded: a restart of the gateway loses it", "context", c.ID, "err", err)
	}
}

func (m *Manager) deleteContextRecord(c *Context) {
	if m.store == nil || c.Isolated {
		return
	}
	ctx, cancel := storeCtx()
	defer cancel()
	if err := m.store.DeleteContext(ctx, c.ID); err != nil {
		m.log.Error("state: context record not deleted", "context", c.ID, "err", err)
	}
}

// putSession records a Jupyter session.
func (m *Manager) putSession(s Session) {
	if m.store == nil {
		return
	}
	ctx, cancel := storeCtx()
	defer cancel()
	rec := state.Session{ID: s.ID, Path: s.Path, Name: s.Name, Type: s.Type, KernelID: s.KernelID, Created: s.created}
	if err := m.store.PutSession(ctx, rec); err != nil {
		m.log.Error("state: session not recorded: a restart of the gateway loses it", "session", s.ID, "err", err)
	}
}

func (m *Manager) deleteSessionRecord(id string) {
	if m.store == nil {
		return
	}
	ctx, cancel := storeCtx()
	defer cancel()
	if err := m.store.DeleteSession(ctx, id); err != nil {
		m.log.Error("state: session record not deleted", "session", id, "err", err)
	}
}

// deleteRuns forgets the records of runs the manager pruned. A write of
// a run in progress is queued before the delete; none follows it.
func (m *Manager) deleteRuns(rs []*Run) {
	if m.store == nil {
		return
	}
	for _, r := range rs {
		r.mu.Lock()
		ps := r.ps
		r.ps = nil
		r.mu.Unlock()
		if ps == nil {
			continue
		}
		ps.wmu.Lock()
		err := m.store.DeleteRun(r.ID)
		ps.wmu.Unlock()
		if err != nil && !errors.Is(err, state.ErrClosed) {
			m.log.Warn("state: run record not deleted", "run", r.ID, "err", err)
		}
	}
}

// checkpoint writes, now and then, the last activity of the kernels
// whose record is CheckpointInterval or more behind it, so that cull
// timers go on from there after a restart. It sleeps until a kernel's
// activity gets that far ahead of its record (noteActivity), then waits
// CheckpointInterval to gather what follows: idle kernels, and kernels
// whose record is recent (just started), cost no wakeup and no write.
func (m *Manager) checkpoint() {
	for {
		select {
		case <-m.active:
		case <-m.closing:
			return
		}
		t := time.NewTimer(m.cfg.CheckpointInterval)
		select {
		case <-t.C:
		case <-m.closing:
			t.Stop()
			return
		}
		for _, k := range m.Kernels() {
			k.mu.Lock()
			jk, behind, removed := k.jk, k.behindLocked(), k.removed
			k.mu.Unlock()
			if removed || jk == nil || !behind {
				continue
			}
			m.putKernel(k, jk)
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
func (m *Manager) noteActivity() {
	select {
	case m.active <- struct{}{}:
	default:
	}
}

// runRecord is a run as the store keeps it (state.Run.Data); its events
// are kept beside it, each as the JSON a client reads.
type runRecord struct {
	Context  string    `json:"context"`
	Language string    `json:"language"`
	Code     string    `json:"code"`
	Stdin    bool      `json:"stdin,omitempty"`
	Created  time.Time `json:"created"`
	Deadline time.Time `json:"deadline,omitzero"`
	State    RunState  `json:"state"`
	// Kernel and MsgID name the kernel running it and its execute_request
	// (set once it started): a gateway started again picks up a run its
	// kernel still runs.
	Kernel string `json:"kernel,omitempty"`
	MsgID  string `json:"msgId,omitempty"`
	// Finished and Execution are set once it ended.
	Finished  time.Time       `json:"finished,omitzero"`
	Execution json.RawMessage `json:"execution,omitempty"`
	Failure   string          `json:"failure,omitempty"`
}

// marshalRunRecord is the JSON of rec with exec (JSON made by
// encoding/json, or nil) as its Execution, last: written by hand, as
// json.Marshal writes the other members, in one allocation, where
// json.Marshal would check and compact exec again.
func marshalRunRecord(rec runRecord, exec []byte) []byte {
	n := 160 + jsonscan.StringLen(rec.Context) + jsonscan.StringLen(rec.Language) + jsonscan.StringLen(rec.Code) +
		jsonscan.StringLen(string(rec.State)) + jsonscan.StringLen(rec.Kernel) + jsonscan.StringLen(rec.MsgID) +
		jsonscan.StringLen(rec.Failure) + len(exec)
	b := make([]byte, 0, n)
	b = append(b, `{"context":`...)
	b = jsonscan.AppendString(b, rec.Context)
	b = append(b, `,"language":`...)
	b = jsonscan.AppendString(b, rec.Language)
	b = append(b, `,"code":`...)
	b = jsonscan.AppendString(b, rec.Code)
	if rec.Stdin {
		b = append(b, `,"stdin":true`...)
	}
	var ok bool
	if b, ok = appendTime(b, `,"created":`, rec.Created); !ok {
		return nil
	}
	if !rec.Deadline.IsZero() {
		if b, ok = appendTime(b, `,"deadline":`, rec.Deadline); !ok {
			return nil
		}
	}
	b = append(b, `,"state":`...)
	b = jsonscan.AppendString(b, string(rec.State))
	if rec.Kernel != "" {
		b = append(b, `,"kernel":`...)
		b = jsonscan.AppendString(b, rec.Kernel)
	}
	if rec.MsgID != "" {
		b = append(b, `,"msgId":`...)
		b = jsonscan.AppendString(b, rec.MsgID)
	}
	if !rec.Finished.IsZero() {
		if b, ok = appendTime(b, `,"finished":`, rec.Finished); !ok {
			return nil
		}
	}
	if rec.Failure != "" {
		b = append(b, `,"failure":`...)
		b = jsonscan.AppendString(b, rec.Failure)
	}
	if len(exec) > 0 {
		b = append(b, `,"execution":`...)
		b = append(b, exec...)
	}
	return append(b, '}')
}

// appendTime appends name and t as time.Time's MarshalJSON writes it;
// false for a time it cannot write (a year outside 0–9999).
func appendTime(b []byte, name string, t time.Time) ([]byte, bool) {
	b = append(b, name...)
	b = append(b, '"')
	b, err := t.AppendText(b)
	return append(b, '"'), err == nil
}

// runStore is how a run writes itself to the store.
type runStore struct {
	m *Manager
	// wmu orders a run's writes: its record is snapshot and queued in
	// the order of its changes. It guards the fields below; it is taken
	// before r.mu, never while holding another lock, and the store's
	// calls it is held across call back only into CommitRunAsync's
	// callback, which takes no lock (commitRunAsync).
	wmu     sync.Mutex
	written int      // events queued so far
	stored  RunState // the state its record was last queued with
	// behind: the store refused a write (state.ErrBusy); the run's
	// writes wait for the catch-up.
	behind bool
	// committing: the commit of the record naming its request was
	// started as its code was sent (writeSending), not waited for.
	committing bool
	// commitErr is that commit's failure: set by the store's callback
	// before the run is marked durable, read (under wmu) only after.
	commitErr error
}

// writeMode says how a run writes itself.
type writeMode uint8

const (
	// writeQueued queues what changed, unless the run is behind (then
	// the catch-up writes it): what a change of the run does.
	writeQueued writeMode = iota
	// writeCatchUp writes what a run behind has not written.
	writeCatchUp
	// writePromise commits the record now, and waits for it: the run's
	// id, or its code, is about to leave the gateway.
	writePromise
	// writeSending starts the commit of the record as its code is sent,
	// and does not wait: the run is durable once the store says so (or
	// once storeTimeout has passed), and its id leaves the gateway only
	// then.
	writeSending
)

// persist queues the run's new events, and its record when it changed.
func (r *Run) persist() { r.write(writeQueued) }

// promise commits the run's record, as it is now, before its id or its
// code leaves the gateway: a gateway started again on the store knows
// the run.
func (r *Run) promise() { r.write(writePromise) }

// promiseSending commits the run's record, naming its kernel and
// request, as its code is sent. A run whose id has not left the gateway
// yet does not wait: the commit is started, the code goes at once, and
// the id leaves once the commit is durable (awaitDurable; the run's end
// waits for it too). A run whose id is out already (it waited for its
// turn or its kernel) waits for the commit before its code goes, so that
// a gateway started again after a crash finds the request it sent.
//
// A run its caller waits for (Run.wait) commits nothing: its record,
// naming its request, is queued with its start, right after.
func (r *Run) promiseSending() {
	if r.wait {
		return
	}
	if r.isDurable() {
		r.promise()
		return
	}
	r.write(writeSending)
}

// madeDurable notes that the run's record is durable (or that there is
// no store): its id may be handed out.
func (r *Run) madeDurable() { r.durableOnce.Do(func() { close(r.durable) }) }

func (r *Run) isDurable() bool {
	select {
	case <-r.durable:
		return true
	default:
		return false
	}
}

// awaitDurable waits until the run's record is durable, the run has
// ended (its end is then durable too), or ctx ends.
func (r *Run) awaitDurable(ctx context.Context) {
	select {
	case <-r.durable:
	case <-r.done:
	case <-ctx.Done():
	}
}

func (r *Run) write(mode writeMode) {
	for {
		wait := r.tryWrite(mode)
		if wait == nil {
			return
		}
		<-wait
	}
}

// tryWrite writes the run as write says, or returns what to wait for
// before trying again: the commit in flight of a run that ended.
func (r *Run) tryWrite(mode writeMode) <-chan struct{} {
	r.mu.Lock()
	ps := r.ps
	r.mu.Unlock()
	if ps == nil {
		return nil
	}
	ps.wmu.Lock()
	defer ps.wmu.Unlock()
	if mode == writeCatchUp {
		ps.behind = false
	}
	r.mu.Lock()
	if r.ps != ps { // frozen (Manager.Detach) or pruned meanwhile
		r.mu.Unlock()
		return nil
	}
	st := r.state
	if st == RunDone && mode == writeQueued && !r.isDurable() && !r.wait {
		if ps.committing {
			// Its record is being committed (its code was sent
			// meanwhile): its end waits for that commit, which
			// storeTimeout bounds, then is queued as any end.
			r.mu.Unlock()
			return r.durable
		}
		// It ended before its record was ever committed (its kernel
		// did not start, it was stopped before it was sent): its id is
		// handed out with its end.
		mode = writePromise
	}
	if st == RunDone && ps.committing && r.isDurable() {
		ps.committing = false
		if err := ps.commitErr; err != nil && !errors.Is(err, state.ErrClosed) {
			ps.m.log.Error("state: run record not committed: a restart of the gateway loses it", "run", r.ID, "err", err)
		}
	}
	if ps.behind && mode == writeQueued {
		r.mu.Unlock() // the catch-up writes it
		return nil
	}
	var evs []state.Event
	n := len(r.events)
	if !ps.behind {
		for i := ps.written; i < n; i++ {
			ev := r.events[i]
			js, err := ev.json(i + 1)
			if err != nil {
				continue
			}
			evs = append(evs, state.Event{Seq: uint64(i + 1), Data: js})
		}
	}
	var data []byte
	if st != ps.stored || mode == writePromise || mode == writeSending {
		rec := runRecord{Context: r.Context, Language: r.Language, Code: r.Code, Stdin: r.Stdin,
			Created: r.created, Deadline: r.deadline, State: st, Kernel: r.kernelID, MsgID: r.msgID}
		var exec []byte
		if st == RunDone {
			rec.Finished = r.finished
			exec = r.executionJSONLocked()
			if r.failure != nil {
				rec.Failure = r.failure.Error()
			}
		}
		data = marshalRunRecord(rec, exec)
	}
	r.mu.Unlock()
	if len(evs) > 0 {
		if err := ps.m.store.AppendRunEvents(r.ID, evs...); errors.Is(err, state.ErrBusy) {
			ps.fallBehind(r)
		} else {
			ps.written = n
		}
	}
	if data == nil {
		return nil
	}
	switch mode {
	case writePromise:
		ps.m.commitRun(r.ID, data)
		ps.stored = st
		r.madeDurable()
		return nil
	case writeSending:
		ps.committing = true
		ps.stored = st
		ps.m.commitRunAsync(r, ps, data)
		return nil
	}
	if ps.behind { // its events first
		return nil
	}
	if err := ps.m.store.PutRun(r.ID, data); errors.Is(err, state.ErrBusy) {
		ps.fallBehind(r)
		return nil
	}
	ps.stored = st
	return nil
}

// fallBehind marks the run behind and hands it to the catch-up. The
// caller holds ps.wmu.
func (ps *runStore) fallBehind(r *Run) {
	if ps.behind {
		return
	}
	ps.behind = true
	m := ps.m
	m.behindMu.Lock()
	m.behind = append(m.behind, r)
	m.behindMu.Unlock()
	m.wakeCatchUp()
}

func (m *Manager) wakeCatchUp() {
	select {
	case m.catchUpWake <- struct{}{}:
	default:
	}
}

// commitRun commits a run's record and waits for it, at most
// storeTimeout. A store that did not commit in time is taken as stuck:
// later promises queue their record without waiting until the catch-up
// sees the store commit again, so that a hung disk costs the runs it
// holds up one wait, not one each.
func (m *Manager) commitRun(id string, data []byte) {
	ctx, cancel := storeCtx()
	if m.storeStuck.Load() {
		cancel() // queued, not waited for
	}
	defer cancel()
	err := m.store.CommitRun(ctx, id, data)
	switch {
	case err == nil, errors.Is(err, state.ErrClosed):
	case ctx.Err() != nil:
		m.commitLate(id)
	default:
		m.log.Error("state: run record not committed: a restart of the gateway loses it", "run", id, "err", err)
	}
}

// commitLate takes the store as stuck: a run's commit did not come
// within storeTimeout.
func (m *Manager) commitLate(id string) {
	if !m.storeStuck.Swap(true) {
		m.log.Error("state: the store did not commit a run's record in time; runs go on without waiting for it until it does, and a crash meanwhile may lose them", "run", id, "waited", storeTimeout)
	}
	m.wakeCatchUp()
}

// commitRunAsync starts the commit of a run's record and returns at
// once; the run is marked durable when the store acknowledges it. One
// that does not within storeTimeout marks the store stuck, as commitRun
// does, and the run goes on as durable; while the store is stuck the
// record is queued and the run durable at once. The store's callback
// (on its writer) only stops a timer, sets commitErr and closes a
// channel. The caller holds ps.wmu.
func (m *Manager) commitRunAsync(r *Run, ps *runStore, data []byte) {
	if m.storeStuck.Load() {
		if err := m.store.CommitRunAsync(r.ID, data, func(error) {}); err != nil && !errors.Is(err, state.ErrClosed) {
			m.log.Error("state: run record not committed: a restart of the gateway loses it", "run", r.ID, "err", err)
		}
		m.wakeCatchUp()
		r.madeDurable()
		return
	}
	// settled: the acknowledgement or the timeout came, whichever first.
	var settled atomic.Bool
	timer := time.AfterFunc(storeTimeout, func() {
		if settled.CompareAndSwap(false, true) {
			m.commitLate(r.ID)
			r.madeDurable()
		}
	})
	err := m.store.CommitRunAsync(r.ID, data, func(err error) {
		if settled.CompareAndSwap(false, true) {
			timer.Stop()
			ps.commitErr = err
			r.madeDurable()
		}
	})
	if err != nil && settled.CompareAndSwap(false, true) {
		timer.Stop()
		if !errors.Is(err, state.ErrClosed) {
			m.log.Error("state: run record not committed: a restart of the gateway loses it", "run", r.ID, "err", err)
		}
		r.madeDurable()
	}
}

// catchUp writes what the store refused of the runs behind, once the
// store has committed what it had queued, and notes when a stuck store
// commits again. It is the one goroutine that waits on the disk for runs.
func (m *Manager) catchUp() {
	ctx := m.closingCtx
	var retry <-chan time.Time
	for {
		select {
		case <-m.catchUpWake:
		case <-retry:
		case <-m.closing:
			return
		}
		retry = nil
		if err := m.writeBehind(ctx); err != nil && ctx.Err() == nil {
			// A commit failed (the disk said no): try again soon.
			m.log.Error("state: run records not written; trying again", "err", err)
			retry = time.After(time.Second)
		}
	}
}

// writeBehind writes the runs behind until none is, or ctx ends.
func (m *Manager) writeBehind(ctx context.Context) error {
	for {
		m.behindMu.Lock()
		rs := m.behind
		m.behind = nil
		m.behindMu.Unlock()
		if len(rs) == 0 && !m.storeStuck.Load() {
			return nil
		}
		if err := m.store.Flush(ctx); err != nil {
			m.behindMu.Lock()
			m.behind = append(rs, m.behind...)
			m.behindMu.Unlock()
			return err
		}
		if m.storeStuck.Swap(false) {
			m.log.Info("state: the store commits again; runs wait for their records again")
		}
		for _, r := range rs {
			r.write(writeCatchUp)
		}
	}
}

// leave closes the kernel's clients and its connection to its process,
// leaving the process running and recorded for the next gateway
// (Manager.Detach). Its last activity is written first.
func (k *Kernel) leave() {
	k.cancelAdoption() // a kept kernel not adopted yet stays as it is
	k.life.Lock()
	defer k.life.Unlock()
	k.mu.Lock()
	if k.removed {
		k.mu.Unlock()
		return
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
	if jk == nil {
		return
	}
	k.m.putKernel(k, jk)
	if d, ok := jk.(interface{ Detach() }); ok {
		d.Detach()
		return
	}
	jk.Shutdown(context.Background())
}

// stopRuns ends the context's queued runs as the gateway stops, and its
// running one unless the kernel is kept (keep): the next gateway picks
// that one up.
func (c *Context) stopRuns(keep bool) {
	c.mu.Lock()
	queued := c.queue
	c.queue = nil
	running := c.running
	c.mu.Unlock()
	for _, r := range queued {
		r.lose(stoppedBeforeStart)
	}
	if running != nil && !keep {
		running.lose("the gateway stopped during the run and shut its kernel down; the next run starts a new kernel without the earlier state")
	}
}

// ContextToken is a context token as kept: the SHA-256 of the token (never
// the token) and its expiry.
type ContextToken = state.TokenHash

// KeepContextToken keeps the hash of a token minted for context id, with
// the context's record: with a store it works after a restart. The
// context's expired tokens are dropped.
func (m *Manager) KeepContextToken(id string, t ContextToken) error {
	c, err := m.Context(id)
	if err != nil {
		return err
	}
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
	m.putContext(c)
	return nil
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

package runs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"kernelgate/internal/jsonscan"
	"kernelgate/state"
)

// A run's record is committed before its id leaves the gateway
// (Promise), unless its id leaves only with its end (a run its caller
// waits for, Spec.Wait): such a run commits nothing and waits for no
// commit; its record and events are queued as they change, as below, and
// listings show it from memory meanwhile. The run next to go on an idle queue is committed as its code
// is sent, naming its kernel and its execute_request: the commit is
// started and the code goes at once, the disk working while the kernel
// does; its id, and its end, wait for the commit. A run that waits for
// its turn or its kernel is committed at once, and again, naming its
// request, before the kernel gets its code. Commits of runs starting
// together share an fsync. Later, its record is written when it starts
// and ends, and its events as they come; those writes are queued by the
// store and committed together (one fsync for many), and never waited
// for: while the store's queue is full (a slow or hung disk,
// state.ErrBusy) the run is behind, its writes wait in the run's own
// memory, and the catch-up writes them in one go once the store has
// committed what it had queued. A kernel's reader never waits on the
// disk.

// StoreTimeout bounds a durable write, a run's promise included.
const StoreTimeout = 10 * time.Second

// Store is the part of the state store runs are kept in (a state.Store
// is one); see state.Store for what each call does.
type Store interface {
	PutRun(id string, data []byte) error
	AppendRunEvents(id string, events ...state.Event) error
	DeleteRun(id string) error
	CommitRun(ctx context.Context, id string, data []byte) error
	CommitRunAsync(id string, data []byte, done func(error)) error
	Flush(ctx context.Context) error
}

var _ Store = state.Store(nil)

// Journal writes runs to a Store. Its catch-up (Run) is the one goroutine
// that waits on the disk for runs.
type Journal struct {
	store Store
	log   *slog.Logger
	// fenced, when set, gives the writes of the runs of a kernel (Fence).
	fenced func(kernel string) Store

	// stuck: a commit did not come within StoreTimeout; promises do not
	// wait until the catch-up sees the store commit again.
	stuck atomic.Bool
	wake  chan struct{}

	behindMu sync.Mutex
	behind   []*Run // runs the store refused writes of (state.ErrBusy)
}

// NewJournal returns a journal writing to store.
func NewJournal(store Store, log *slog.Logger) *Journal {
	return &Journal{store: store, log: log, wake: make(chan struct{}, 1)}
}

// Fence makes the records and events of each run sent to a kernel go
// through writer(kernel) (a store shared by replicas: the kernel's fenced
// writes, state.Fenced); a run not sent yet writes to the journal's
// store. Call it before the journal writes anything.
func (j *Journal) Fence(writer func(kernel string) Store) { j.fenced = writer }

// storeOf is where the writes of a run sent to kernel go.
func (j *Journal) storeOf(kernel string) Store {
	if j.fenced == nil || kernel == "" {
		return j.store
	}
	return j.fenced(kernel)
}

// Stuck reports whether the store is taken as stuck: a commit did not
// come within StoreTimeout, and promises do not wait for it until it
// commits again.
func (j *Journal) Stuck() bool { return j.stuck.Load() }

func storeCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), StoreTimeout)
}

// deleteRuns forgets the records of runs the table pruned. A write of
// a run in progress is queued before the delete; none follows it.
func (j *Journal) deleteRuns(rs []*Run) {
	if j == nil {
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
		err := j.store.DeleteRun(r.ID)
		ps.wmu.Unlock()
		if err != nil && !errors.Is(err, state.ErrClosed) {
			j.log.Warn("state: run record not deleted", "run", r.ID, "err", err)
		}
	}
}

// Record is a run as the store keeps it (state.Run.Data); its events
// are kept beside it, each as the JSON a client reads.
type Record struct {
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
	// Kind is RecordCommand for a command's run recorded before it
	// started (by the replica that forwarded it); "" for code.
	Kind string `json:"kind,omitempty"`
	// Forwarded: the record is the one the replica that accepted the
	// run wrote before forwarding it; the owner has not written it since
	// (any write of the owner's clears it). Such a run is not taken over
	// from the store: the replica that forwarded it asks the next owner
	// for it under its id while its client waits (Table.Restore).
	Forwarded bool `json:"forwarded,omitempty"`
	// Finished and Execution are set once it ended.
	Finished  time.Time       `json:"finished,omitzero"`
	Execution json.RawMessage `json:"execution,omitempty"`
	Failure   string          `json:"failure,omitempty"`
}

// RecordCommand is Record.Kind of a command's run.
const RecordCommand = "command"

// marshalRunRecord is the JSON of rec with exec (JSON made by
// encoding/json, or nil) as its Execution, last: written by hand, as
// json.Marshal writes the other members, in one allocation, where
// json.Marshal would check and compact exec again.
func marshalRunRecord(rec Record, exec []byte) []byte {
	n := 160 + jsonscan.StringLen(rec.Context) + jsonscan.StringLen(rec.Language) + jsonscan.StringLen(rec.Code) +
		jsonscan.StringLen(string(rec.State)) + jsonscan.StringLen(rec.Kernel) + jsonscan.StringLen(rec.MsgID) +
		jsonscan.StringLen(rec.Failure) + jsonscan.StringLen(rec.Kind) + len(exec)
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
	if rec.Kind != "" {
		b = append(b, `,"kind":`...)
		b = jsonscan.AppendString(b, rec.Kind)
	}
	if rec.Forwarded {
		b = append(b, `,"forwarded":true`...)
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
	j *Journal
	// wmu orders a run's writes: its record is snapshot and queued in
	// the order of its changes. It guards the fields below; it is taken
	// before r.mu, never while holding another lock, and the store's
	// calls it is held across call back only into CommitRunAsync's
	// callback, which takes no lock (commitAsync).
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
	// recorded: the run's record was in the store before it came here
	// (Spec.Recorded): the record naming its request must be committed
	// before its code goes, and a failed commit keeps it from going.
	recorded bool
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
	// once StoreTimeout has passed), and its id leaves the gateway only
	// then.
	writeSending
)

// persist queues the run's new events, and its record when it changed.
func (r *Run) persist() { r.write(writeQueued) }

// Promise commits the run's record, as it is now, before its id or its
// code leaves the gateway: a gateway started again on the store knows
// the run.
func (r *Run) Promise() { r.write(writePromise) }

// promiseSending commits the run's record, naming its kernel and
// request, as its code is sent. A run whose id has not left the gateway
// yet does not wait: the commit is started, the code goes at once, and
// the id leaves once the commit is durable (awaitDurable; the run's end
// waits for it too). A run whose id is out already (it waited for its
// turn or its kernel) waits for the commit before its code goes, so that
// a gateway started again after a crash finds the request it sent.
//
// A run its caller waits for (Spec.Wait) commits nothing: its record,
// naming its request, is queued with its start, right after.
//
// A recorded run (Spec.Recorded) is not sent unless that commit is made
// (under its kernel's fence, among replicas): the error, wrapping
// ErrNotSent, says it was not.
func (r *Run) promiseSending() error {
	if r.wait {
		return nil
	}
	if r.isDurable() {
		return r.write(writePromise)
	}
	r.write(writeSending)
	return nil
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

// AwaitDurable waits until the run's record is durable, the run has
// ended (its end is then durable too), or ctx ends.
func (r *Run) AwaitDurable(ctx context.Context) {
	select {
	case <-r.durable:
	case <-r.done:
	case <-ctx.Done():
	}
}

// write writes the run as mode says; the error is a recorded run's
// commit that failed (writePromise).
func (r *Run) write(mode writeMode) error {
	for {
		wait, err := r.tryWrite(mode)
		if wait == nil {
			return err
		}
		<-wait
	}
}

// tryWrite writes the run as write says, or returns what to wait for
// before trying again: the commit in flight of a run that ended.
func (r *Run) tryWrite(mode writeMode) (<-chan struct{}, error) {
	r.mu.Lock()
	ps := r.ps
	r.mu.Unlock()
	if ps == nil {
		return nil, nil
	}
	ps.wmu.Lock()
	defer ps.wmu.Unlock()
	if mode == writeCatchUp {
		ps.behind = false
	}
	r.mu.Lock()
	if r.ps != ps { // frozen (Table.Freeze) or pruned meanwhile
		r.mu.Unlock()
		return nil, nil
	}
	st := r.state
	if st == RunDone && mode == writeQueued && !r.isDurable() && !r.wait {
		if ps.committing {
			// Its record is being committed (its code was sent
			// meanwhile): its end waits for that commit, which
			// StoreTimeout bounds, then is queued as any end.
			r.mu.Unlock()
			return r.durable, nil
		}
		// It ended before its record was ever committed (its kernel
		// did not start, it was stopped before it was sent): its id is
		// handed out with its end.
		mode = writePromise
	}
	if st == RunDone && ps.committing && r.isDurable() {
		ps.committing = false
		if err := ps.commitErr; err != nil && !errors.Is(err, state.ErrClosed) {
			ps.j.log.Error("state: run record not committed: a restart of the gateway loses it", "run", r.ID, "err", err)
		}
	}
	if ps.behind && mode == writeQueued {
		r.mu.Unlock() // the catch-up writes it
		return nil, nil
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
		rec := Record{Context: r.Context, Language: r.Language, Code: r.Code, Stdin: r.Stdin,
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
	kernel := r.kernelID
	r.mu.Unlock()
	w := ps.j.storeOf(kernel)
	if len(evs) > 0 {
		if err := w.AppendRunEvents(r.ID, evs...); errors.Is(err, state.ErrBusy) {
			ps.fallBehind(r)
		} else {
			ps.written = n
		}
	}
	if data == nil {
		return nil, nil
	}
	switch mode {
	case writePromise:
		err := ps.j.commit(w, r.ID, data)
		if ps.recorded && err != nil {
			return nil, fmt.Errorf("%w: the record naming its request was not committed: %w", ErrNotSent, err)
		}
		ps.stored = st
		r.madeDurable()
		return nil, nil
	case writeSending:
		ps.committing = true
		ps.stored = st
		ps.j.commitAsync(w, r, ps, data)
		return nil, nil
	}
	if ps.behind { // its events first
		return nil, nil
	}
	if err := w.PutRun(r.ID, data); errors.Is(err, state.ErrBusy) {
		ps.fallBehind(r)
		return nil, nil
	}
	ps.stored = st
	return nil, nil
}

// fallBehind marks the run behind and hands it to the catch-up. The
// caller holds ps.wmu.
func (ps *runStore) fallBehind(r *Run) {
	if ps.behind {
		return
	}
	ps.behind = true
	j := ps.j
	j.behindMu.Lock()
	j.behind = append(j.behind, r)
	j.behindMu.Unlock()
	j.wakeCatchUp()
}

func (j *Journal) wakeCatchUp() {
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// commit commits a run's record and waits for it, at most
// StoreTimeout. A store that did not commit in time is taken as stuck:
// later promises queue their record without waiting until the catch-up
// sees the store commit again, so that a hung disk costs the runs it
// holds up one wait, not one each. The error is the commit's (nil once
// committed), for a caller that must not go on without it.
func (j *Journal) commit(w Store, id string, data []byte) error {
	ctx, cancel := storeCtx()
	if j.stuck.Load() {
		cancel() // queued, not waited for
	}
	defer cancel()
	err := w.CommitRun(ctx, id, data)
	switch {
	case err == nil, errors.Is(err, state.ErrClosed):
	case ctx.Err() != nil:
		j.commitLate(id)
	default:
		j.log.Error("state: run record not committed: a restart of the gateway loses it", "run", id, "err", err)
	}
	return err
}

// commitLate takes the store as stuck: a run's commit did not come
// within StoreTimeout.
func (j *Journal) commitLate(id string) {
	if !j.stuck.Swap(true) {
		j.log.Error("state: the store did not commit a run's record in time; runs go on without waiting for it until it does, and a crash meanwhile may lose them", "run", id, "waited", StoreTimeout)
	}
	j.wakeCatchUp()
}

// commitAsync starts the commit of a run's record and returns at
// once; the run is marked durable when the store acknowledges it. One
// that does not within StoreTimeout marks the store stuck, as commit
// does, and the run goes on as durable; while the store is stuck the
// record is queued and the run durable at once. The store's callback
// (on its writer) only stops a timer, sets commitErr and closes a
// channel. The caller holds ps.wmu.
func (j *Journal) commitAsync(w Store, r *Run, ps *runStore, data []byte) {
	if j.stuck.Load() {
		if err := w.CommitRunAsync(r.ID, data, func(error) {}); err != nil && !errors.Is(err, state.ErrClosed) {
			j.log.Error("state: run record not committed: a restart of the gateway loses it", "run", r.ID, "err", err)
		}
		j.wakeCatchUp()
		r.madeDurable()
		return
	}
	// settled: the acknowledgement or the timeout came, whichever first.
	var settled atomic.Bool
	timer := time.AfterFunc(StoreTimeout, func() {
		if settled.CompareAndSwap(false, true) {
			j.commitLate(r.ID)
			r.madeDurable()
		}
	})
	err := w.CommitRunAsync(r.ID, data, func(err error) {
		if settled.CompareAndSwap(false, true) {
			timer.Stop()
			ps.commitErr = err
			r.madeDurable()
		}
	})
	if err != nil && settled.CompareAndSwap(false, true) {
		timer.Stop()
		if !errors.Is(err, state.ErrClosed) {
			j.log.Error("state: run record not committed: a restart of the gateway loses it", "run", r.ID, "err", err)
		}
		r.madeDurable()
	}
}

// Run writes what the store refused of the runs behind, once the store
// has committed what it had queued, and notes when a stuck store commits
// again, until ctx ends. It is the one goroutine that waits on the disk
// for runs; its caller owns it.
func (j *Journal) Run(ctx context.Context) {
	var retry <-chan time.Time
	for {
		select {
		case <-j.wake:
		case <-retry:
		case <-ctx.Done():
			return
		}
		retry = nil
		if err := j.WriteBehind(ctx); err != nil && ctx.Err() == nil {
			// A commit failed (the disk said no): try again soon.
			j.log.Error("state: run records not written; trying again", "err", err)
			retry = time.After(time.Second)
		}
	}
}

// WriteBehind writes the runs behind until none is, or ctx ends.
func (j *Journal) WriteBehind(ctx context.Context) error {
	for {
		j.behindMu.Lock()
		rs := j.behind
		j.behind = nil
		j.behindMu.Unlock()
		if len(rs) == 0 && !j.stuck.Load() {
			return nil
		}
		if err := j.store.Flush(ctx); err != nil {
			j.behindMu.Lock()
			j.behind = append(rs, j.behind...)
			j.behindMu.Unlock()
			return err
		}
		if j.stuck.Swap(false) {
			j.log.Info("state: the store commits again; runs wait for their records again")
		}
		for _, r := range rs {
			r.write(writeCatchUp)
		}
	}
}

package runs

import (
	"encoding/json"
	"sort"
	"sync"
	"time"

	"kernelgate/state"
)

// Observer is told how runs end, for metrics. RunEnded is called from
// the run's goroutines and must not block.
type Observer interface {
	RunEnded(language string, reason Reason, took time.Duration, truncated bool)
}

// TableConfig bounds what a Table keeps.
type TableConfig struct {
	// Limits bound what one run keeps of its output.
	Limits Limits
	// Kept, Bytes and Retention bound the finished runs kept: at most
	// Kept runs, Bytes of their records, none older than Retention.
	Kept      int
	Bytes     int64
	Retention time.Duration
	// Observer is told how each run ends (nil: no one).
	Observer Observer
	// Journal writes the runs to the store (nil: they are kept in
	// memory only).
	Journal *Journal
}

// Table holds the runs by id: those queued or running, and the finished
// ones while its bounds keep them.
type Table struct {
	cfg TableConfig

	mu    sync.Mutex
	runs  map[string]*Run
	order []*Run // oldest first
	bytes int64  // of the finished runs counted
}

// NewTable returns an empty table.
func NewTable(cfg TableConfig) *Table {
	return &Table{cfg: cfg, runs: map[string]*Run{}}
}

// Spec is what a new run is made of.
type Spec struct {
	ID       string // "": a new one (NewID)
	Context  string
	Language string
	Code     string
	Stdin    bool
	Timeout  time.Duration // 0: none
	// DisplayResults: the kernel shows its code's values with
	// display_data (IRkernel), and those without an image are main
	// results.
	DisplayResults bool
	// Wait: its caller waits for its end, which hands its id out (a
	// plain POST /api/execute): it commits nothing and waits for no
	// commit; its record and events are queued as they change.
	Wait bool
	// Recorded: the run's record is in the store already, queued, made
	// by the replica that accepted it and forwarded it here under ID
	// (Record). The run is durable at once, and the record naming its
	// request is committed, under its kernel's fence, before its code
	// goes: a replica taking the kernel over follows a run so recorded,
	// and sends one its owner recorded queued (Record.Forwarded). Wait
	// then only says who waits: the commit is made all the same.
	Recorded bool
	// Created and Deadline, with Recorded, are the record's: the run's
	// timeout counts from when it was accepted.
	Created, Deadline time.Time
}

// New makes a run, queued, and keeps it.
func (t *Table) New(s Spec) *Run {
	r, _ := t.newRun(s, false)
	return r
}

// NewOrGet is New for a run of a given id (Spec.ID), unless a run of
// that id is kept already: that one is returned, and existed is true
// (a forward of the same run tried again, or the run restored from the
// store meanwhile). The check and the keeping are one step.
func (t *Table) NewOrGet(s Spec) (r *Run, existed bool) {
	return t.newRun(s, true)
}

func (t *Table) newRun(s Spec, once bool) (*Run, bool) {
	if s.ID == "" {
		s.ID = NewID()
	}
	r := newRun(s.ID, s.Context, s.Language, s.Code, s.Stdin, s.Timeout, t.cfg.Limits)
	r.b.displayResults = s.DisplayResults
	r.observer = t.cfg.Observer
	r.onEnd = t.ended
	r.wait = s.Wait && !s.Recorded
	if s.Recorded {
		if !s.Created.IsZero() {
			r.created = s.Created
		}
		r.deadline = s.Deadline
	}
	if t.cfg.Journal != nil {
		r.ps = &runStore{j: t.cfg.Journal, recorded: s.Recorded}
	}
	if t.cfg.Journal == nil || s.Recorded {
		r.madeDurable()
	}
	t.mu.Lock()
	pruned := t.pruneLocked()
	if old, ok := t.runs[s.ID]; ok && once {
		t.mu.Unlock()
		t.cfg.Journal.deleteRuns(pruned)
		return old, true
	}
	t.runs[s.ID] = r
	t.order = append(t.order, r)
	t.mu.Unlock()
	t.cfg.Journal.deleteRuns(pruned)
	return r, false
}

// Drop forgets a run its queue refused, and ends it: nothing waits for
// it, and no record of it is kept.
func (t *Table) Drop(r *Run, why error) {
	t.mu.Lock()
	if t.runs[r.ID] == r {
		delete(t.runs, r.ID)
		// It is the newest run, or close to it.
		for i := len(t.order) - 1; i >= 0; i-- {
			if t.order[i] == r {
				t.order = append(t.order[:i], t.order[i+1:]...)
				break
			}
		}
	}
	t.mu.Unlock()
	r.refuse(why)
	t.cfg.Journal.deleteRuns([]*Run{r})
}

// ended counts a finished run's memory and prunes the records.
func (t *Table) ended(r *Run) {
	size := r.Memory()
	t.mu.Lock()
	if t.runs[r.ID] == r && !r.counted {
		r.counted = true
		t.bytes += size
	}
	pruned := t.pruneLocked()
	t.mu.Unlock()
	t.cfg.Journal.deleteRuns(pruned)
}

// pruneLocked forgets the oldest finished runs while more than Kept runs
// or Bytes of finished runs are kept, and those past the retention time.
// It goes from the oldest run and stops at the first finished run it
// keeps; runs still queued or running are passed over and kept whatever
// their age, so one long run does not hold back the pruning of those
// after it. It returns the runs pruned whose records the store keeps, for
// deleteRuns once t.mu is released.
func (t *Table) pruneLocked() (pruned []*Run) {
	now := time.Now()
	n := len(t.order)
	kept := t.order[:0:0]
	i := 0
	for ; i < len(t.order); i++ {
		r := t.order[i]
		r.mu.Lock()
		done, at, size := r.state == RunDone, r.finished, r.kept
		r.mu.Unlock()
		if !done {
			kept = append(kept, r)
			continue
		}
		if n <= t.cfg.Kept && t.bytes <= t.cfg.Bytes && now.Sub(at) <= t.cfg.Retention {
			break
		}
		delete(t.runs, r.ID)
		if t.cfg.Journal != nil {
			pruned = append(pruned, r)
		}
		if r.counted {
			t.bytes -= size
		}
		n--
	}
	if n == len(t.order) {
		return nil
	}
	// The unfinished runs passed over go right before the first run kept
	// after them, and the order starts there: the runs after it are not
	// copied (a copy of the whole order per run was O(Kept) under t.mu);
	// append reallocates once the front's room is used up.
	start := i - len(kept)
	copy(t.order[start:i], kept)
	clear(t.order[:start])
	t.order = t.order[start:]
	return pruned
}

// Kept returns the ids whose runs are still kept, in their order.
func (t *Table) Kept(ids []string) []string {
	t.mu.Lock()
	pruned := t.pruneLocked()
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		// A run whose record is not durable yet is not shown: its id
		// is handed out only once it is (Promise). A run its caller
		// waits for is shown from memory: nothing of it is promised
		// while it runs.
		if r, ok := t.runs[id]; ok && (r.wait || r.isDurable()) {
			out = append(out, id)
		}
	}
	t.mu.Unlock()
	t.cfg.Journal.deleteRuns(pruned)
	return out
}

// Get returns a run by id.
func (t *Table) Get(id string) (*Run, error) {
	t.mu.Lock()
	pruned := t.pruneLocked()
	r, ok := t.runs[id]
	t.mu.Unlock()
	t.cfg.Journal.deleteRuns(pruned)
	if !ok {
		return nil, errorf(ErrNoSuchRun, "no run %q (finished runs are kept for %v)", id, t.cfg.Retention)
	}
	return r, nil
}

// Runs returns the runs kept, oldest first.
func (t *Table) Runs() []*Run {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]*Run(nil), t.order...)
}

// TableStats is what a table holds: Runs by id, Ordered in its order
// (the same runs), Bytes of the finished runs' records.
type TableStats struct {
	Runs, Ordered int
	Bytes         int64
}

// Stats says what the table holds.
func (t *Table) Stats() TableStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return TableStats{Runs: len(t.runs), Ordered: len(t.order), Bytes: t.bytes}
}

// Freeze stops writing the runs still running: the kernels running them
// are left to the next gateway, which picks them up from their records as
// they are now.
func (t *Table) Freeze() {
	t.mu.Lock()
	rs := make([]*Run, 0, len(t.runs))
	for _, r := range t.runs {
		rs = append(rs, r)
	}
	t.mu.Unlock()
	for _, r := range rs {
		r.mu.Lock()
		if r.state != RunDone {
			r.ps = nil
		}
		r.mu.Unlock()
	}
}

// Restored is a run read back from the store: Kernel and MsgID name the
// kernel and the execute_request of a run that was running.
type Restored struct {
	Run    *Run
	Kernel string
	MsgID  string
	// Command: a command's run (Record.Kind), not code.
	Command bool
}

// Restore takes the kept run records over, oldest first, as they were:
// their owner ends those that did not (Run.Lose) or follows them. A
// record that cannot be read is deleted.
func (t *Table) Restore(recs []state.Run) []Restored {
	var out []Restored
	for _, sr := range recs {
		var rec Record
		err := json.Unmarshal(sr.Data, &rec)
		known := rec.State == RunQueued || rec.State == RunRunning || rec.State == RunDone
		if err != nil || rec.Created.IsZero() || !known {
			if j := t.cfg.Journal; j != nil {
				if err := j.store.DeleteRun(sr.ID); err != nil {
					j.log.Warn("state: run record not deleted", "run", sr.ID, "err", err)
				}
			}
			continue
		}
		if rec.State == RunQueued && rec.MsgID == "" && rec.Forwarded {
			// Only the forwarding replica knows it: it asks the owner
			// for it by its id while its client waits; none sends it
			// otherwise (a client that had no answer has no id).
			continue
		}
		out = append(out, Restored{t.restored(sr.ID, rec, sr.Events), rec.Kernel, rec.MsgID, rec.Kind == RecordCommand})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Run.created.Before(out[j].Run.created) })
	t.mu.Lock()
	kept := out[:0]
	for _, kr := range out {
		r := kr.Run
		if _, ok := t.runs[r.ID]; ok {
			// Known here already: forwarded here under its id while
			// its record was read. The run kept is the one.
			continue
		}
		kept = append(kept, kr)
		t.runs[r.ID] = r
		t.order = append(t.order, r)
		if r.state == RunDone {
			r.counted = true
			t.bytes += r.kept
		}
	}
	t.mu.Unlock()
	return kept
}

// Forget stops writing rs to the store: another replica owns their
// kernel now and writes them. They stay in the table.
func (t *Table) Forget(rs []*Run) {
	for _, r := range rs {
		r.forget()
	}
}

// forget stops writing r: another replica has it.
func (r *Run) forget() {
	r.mu.Lock()
	r.ps = nil
	r.forgotten = true
	r.mu.Unlock()
}

// Forgotten reports whether this gateway let the run go to the replica
// that owns its kernel now (Table.Forget, or its code not sent: ErrNotSent):
// how it ended here is not its end; the owner's answer is.
func (r *Run) Forgotten() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.forgotten
}

package sessions

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"
)

// RunState is where a run is in its life.
type RunState string

// The states of a run.
const (
	RunQueued  RunState = "queued"
	RunRunning RunState = "running"
	RunDone    RunState = "done"
)

// Event is one event of a run's stream, ready to write: its JSON has type
// and seq.
type Event struct {
	Seq  int
	Type string
	JSON []byte
}

// Run is one execution of code: queued, running, then done. It outlives
// the request that started it and is kept for a while after it ends.
type Run struct {
	ID       string
	Context  string
	Language string
	Stdin    bool
	Code     string

	created  time.Time
	deadline time.Time // zero: no timeout

	mu        sync.Mutex
	state     RunState
	b         builder
	events    []Event
	eventMem  int
	maxEvents int
	changed   chan struct{} // closed and replaced on every change
	done      chan struct{}
	finished  time.Time
	failure   error // the run could not start (its kernel did not)

	// set by the context while the run executes
	interrupted bool
	timedOut    bool
	cancel      func(Reason) // ends a queued run or interrupts a running one
	input       func(value string) error
	awaiting    bool // an input_request waits for an answer
	// stopBeforeStart ends a run its worker took but did not start yet.
	stopBeforeStart Reason

	observer Observer
	timer    *time.Timer // the timeout, stopped when the run ends
}

func newRun(id, context, language, code string, stdin bool, timeout time.Duration, limits Limits) *Run {
	r := &Run{
		ID: id, Context: context, Language: language, Code: code, Stdin: stdin,
		created: time.Now(),
		state:   RunQueued,
		changed: make(chan struct{}),
		done:    make(chan struct{}),
		// Events carry the same output as the Execution: the same limits
		// bound them, plus room for the small events around it.
		maxEvents: limits.LogBytes + limits.ResultBytes + 1<<20,
	}
	if timeout > 0 {
		r.deadline = r.created.Add(timeout)
	}
	r.b = builder{limits: limits, emit: r.emitLocked}
	r.b.exec = Execution{ID: id, Context: context, Language: language,
		Logs: Logs{Stdout: []string{}, Stderr: []string{}}, Results: []*Result{}}
	r.emitLocked("start", map[string]string{"run": id, "context": context, "language": language})
	return r
}

// emitLocked appends an event; the caller holds r.mu (or owns r).
func (r *Run) emitLocked(typ string, payload any) {
	seq := len(r.events) + 1
	js, err := eventJSON(typ, seq, payload)
	if err != nil {
		return
	}
	if typ != "end" && r.eventMem+len(js) > r.maxEvents {
		return
	}
	r.eventMem += len(js)
	r.events = append(r.events, Event{Seq: seq, Type: typ, JSON: js})
	close(r.changed)
	r.changed = make(chan struct{})
}

// endEvent is the payload of a run's end event.
type endEvent struct {
	ExecutionCount *int         `json:"executionCount"`
	Process        ProcessState `json:"process"`
	Truncated      bool         `json:"truncated"`
}

// eventJSON merges type and seq into the payload's JSON object. Event
// types are plain words, written as they are.
func eventJSON(typ string, seq int, payload any) ([]byte, error) {
	var body []byte
	if payload != nil {
		var err error
		if body, err = json.Marshal(payload); err != nil {
			return nil, err
		}
	}
	out := make([]byte, 0, 32+len(body))
	out = append(out, `{"type":"`...)
	out = append(out, typ...)
	out = append(out, `","seq":`...)
	out = strconv.AppendInt(out, int64(seq), 10)
	if len(body) <= 2 { // {} or null
		return append(out, '}'), nil
	}
	out = append(out, ',')
	return append(out, body[1:]...), nil
}

// KeepaliveJSON is the keepalive event a stream sends while quiet; its seq
// is the last event's, so resuming after it loses nothing.
func KeepaliveJSON(lastSeq int) []byte {
	js, _ := eventJSON("keepalive", lastSeq, nil)
	return js
}

// Done is closed when the run has ended.
func (r *Run) Done() <-chan struct{} { return r.done }

// Wait waits for the run to end or ctx to end.
func (r *Run) Wait(ctx context.Context) error {
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Failure is why the run could not start, if it could not.
func (r *Run) Failure() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failure
}

// State is where the run is.
func (r *Run) State() RunState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state
}

// ExecutionJSON returns the run's Execution as JSON, as far as it got.
func (r *Run) ExecutionJSON() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	js, _ := json.Marshal(&r.b.exec)
	return js
}

// RunModel is GET /api/runs/{id}.
type RunModel struct {
	ID        string          `json:"id"`
	Context   string          `json:"context"`
	State     RunState        `json:"state"`
	Execution json.RawMessage `json:"execution"`
}

// Model returns the run's record.
func (r *Run) Model() RunModel {
	exec := r.ExecutionJSON()
	return RunModel{ID: r.ID, Context: r.Context, State: r.State(), Execution: exec}
}

// Events returns the events after seq, a channel closed at the next
// change, and whether the run has ended (then no more will come).
func (r *Run) Events(after int) ([]Event, <-chan struct{}, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if after < 0 {
		after = 0
	}
	var out []Event
	if after < len(r.events) {
		out = append(out, r.events[after:]...)
	}
	return out, r.changed, r.state == RunDone
}

// End returns the run's end event once it has ended.
func (r *Run) End() (Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != RunDone || len(r.events) == 0 {
		return Event{}, false
	}
	return r.events[len(r.events)-1], true
}

// LastSeq is the seq of the run's latest event.
func (r *Run) LastSeq() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// handle folds a kernel message of the run (called from the kernel's
// reader goroutines).
func (r *Run) handle(m *Message, ch Channel) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == RunDone {
		return
	}
	if m.Type() == "input_request" {
		r.awaiting = true
	}
	r.b.message(ch, m)
}

// start marks the run running.
func (r *Run) start() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != RunQueued {
		return false
	}
	r.state = RunRunning
	r.b.started = true
	return true
}

// end closes the run with reason; only the first end counts.
func (r *Run) end(reason Reason, failure error) bool {
	return r.endWith(reason, failure, "")
}

// lose ends a run whose kernel went away, saying why.
func (r *Run) lose(why string) { r.endWith(Lost, nil, why) }

func (r *Run) endWith(reason Reason, failure error, message string) bool {
	r.mu.Lock()
	if r.state == RunDone {
		r.mu.Unlock()
		return false
	}
	r.state = RunDone
	r.failure = failure
	r.finished = time.Now()
	r.b.finish(reason)
	r.b.exec.Process.Message = message
	r.emitLocked("end", endEvent{r.b.exec.ExecutionCount, r.b.exec.Process, r.b.exec.Truncated})
	r.cancel, r.input = nil, nil
	if r.timer != nil {
		r.timer.Stop()
	}
	took, truncated := r.finished.Sub(r.created), r.b.exec.Truncated
	r.mu.Unlock()
	close(r.done)
	if r.observer != nil {
		r.observer.RunEnded(r.Language, reason, took, truncated)
	}
	return true
}

// Interrupt ends a queued run, or interrupts a running one (it then ends
// interrupted).
func (r *Run) Interrupt() {
	r.mu.Lock()
	cancel := r.cancel
	if r.state == RunRunning {
		r.interrupted = true
	}
	r.mu.Unlock()
	if cancel != nil {
		cancel(Interrupted)
	}
}

// Input answers the run's pending input_request.
func (r *Run) Input(value string) error {
	r.mu.Lock()
	fn, awaiting := r.input, r.awaiting
	if awaiting {
		r.awaiting = false
	}
	r.mu.Unlock()
	if fn == nil || !awaiting {
		return errorf(ErrBadRequest, "run %s is not waiting for input", r.ID)
	}
	return fn(value)
}

package runs

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"kernelgate/internal/jsonscan"
	"kernelgate/jupyter"
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

// event is an event as a run keeps it: its payload shares the output's
// text and results with the run's Execution, and is written as JSON when
// the event is read. A payload is not changed after it is emitted.
type event struct {
	typ     string
	payload any
	// raw, when set, is the event's JSON as read back from the store
	// (a run of an earlier gateway); payload is then nil.
	raw []byte
}

// json writes the event as the seq-th of its run.
func (ev event) json(seq int) ([]byte, error) {
	if ev.raw != nil {
		return ev.raw, nil
	}
	return eventJSON(ev.typ, seq, ev.payload)
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
	events    []event
	eventMem  int
	maxEvents int
	changed   chan struct{} // closed and replaced on every change
	done      chan struct{}
	finished  time.Time
	failure   error // the run could not start (its kernel did not)
	// execJSON is the Execution as JSON once the run has ended (it no
	// longer changes then): written once for the store and the answer.
	execJSON []byte

	// set by its queue (or its driver, SetControls) while the run executes
	interrupted bool
	timedOut    bool
	cancel      func(Reason) // ends a queued run or interrupts a running one
	input       func(value string) error
	awaiting    bool // an input_request waits for an answer
	// set for a command (Controls): any input is taken, Kill kills
	// its process group, and exitCode is its exit status once it ended.
	anyInput   bool
	kill       func()
	closeInput func()
	exitCode   *int
	// stopBeforeStart ends a run its worker took but did not start yet.
	stopBeforeStart Reason
	// notice, when set, is the end's process message of a run that did
	// not lose its kernel: its kernel was replaced since the last run.
	notice string

	// ps writes the run to the state store (nil: none). kernelID and
	// msgID name its kernel and execute_request once it is sent.
	// durable is closed once its record is durable (at once without a
	// store): its id is handed out only then (Promise).
	ps          *runStore
	kernelID    string
	msgID       string
	durable     chan struct{}
	durableOnce sync.Once
	// wait: its caller waits for its end, and its id leaves the gateway
	// only with it (ExecuteRequest.Wait). Nothing of it is promised while
	// it runs: its record and events are queued as they change, like
	// every run's later writes, and never waited for.
	wait bool
	// forgotten: let go to another replica (Forgotten).
	forgotten bool
	// command: a command's run (Record.Kind), never sent to a kernel.
	command bool

	observer Observer
	onEnd    func(*Run)  // the table's accounting, told once the run ended
	timer    *time.Timer // the timeout, stopped when the run ends
	kept     int64       // the record's memory, set when the run ends
	counted  bool        // kept is in the table's bytes (guarded by its mu)
}

func newRun(id, context, language, code string, stdin bool, timeout time.Duration, limits Limits) *Run {
	r := &Run{
		ID: id, Context: context, Language: language, Code: code, Stdin: stdin,
		created: time.Now(),
		state:   RunQueued,
		changed: make(chan struct{}),
		done:    make(chan struct{}),
		durable: make(chan struct{}),
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
	size := eventSize(typ, payload)
	if size < 0 || (typ != "end" && r.eventMem+size > r.maxEvents) {
		return
	}
	r.eventMem += size
	r.events = append(r.events, event{typ: typ, payload: payload})
	close(r.changed)
	r.changed = make(chan struct{})
}

// eventSize is about what an event's JSON takes beyond the output it
// shares with the Execution; -1 when its payload cannot be written.
func eventSize(typ string, payload any) int {
	const frame = 32 // {"type":…,"seq":…}
	switch p := payload.(type) {
	case *Result:
		return frame + len(typ) + p.size
	case textEvent:
		return frame + len(typ) + len(p.Text)
	case map[string]string: // start
		n := frame + len(typ)
		for k, v := range p {
			n += jsonscan.StringLen(k) + jsonscan.StringLen(v) + 2
		}
		return n
	case endEvent:
		return frame + len(typ) + 96 + len(p.Process.Reason) + jsonscan.StringLen(p.Process.Message)
	}
	js, err := json.Marshal(payload)
	if err != nil {
		return -1
	}
	return frame + len(typ) + len(js)
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
	var err error
	switch p := payload.(type) {
	case textEvent:
		return appendTextEvent(typ, seq, p), nil
	case nil:
	case *Result: // compact JSON already: not checked and compacted again
		body, err = p.MarshalJSON()
	case map[string]string: // start
		body = appendStringMap(nil, p)
	case endEvent:
		body = appendEndEvent(nil, p)
	default:
		body, err = json.Marshal(payload)
	}
	if err != nil {
		return nil, err
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
// The caller must not change it.
func (r *Run) ExecutionJSON() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.executionJSONLocked()
}

// executionJSONLocked is ExecutionJSON; the caller holds r.mu. The JSON
// of an ended run is made once.
func (r *Run) executionJSONLocked() []byte {
	if r.execJSON != nil {
		return r.execJSON
	}
	js := marshalExecution(&r.b.exec)
	if r.state == RunDone {
		r.execJSON = js
	}
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
	for i := after; i < len(r.events); i++ {
		ev := r.events[i]
		js, err := ev.json(i + 1)
		if err != nil {
			continue
		}
		out = append(out, Event{Seq: i + 1, Type: ev.typ, JSON: js})
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
	seq := len(r.events)
	ev := r.events[seq-1]
	js, err := ev.json(seq)
	if err != nil {
		return Event{}, false
	}
	return Event{Seq: seq, Type: ev.typ, JSON: js}, true
}

// LastSeq is the seq of the run's latest event.
func (r *Run) LastSeq() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// Handle folds a kernel message of the run (called from the kernel's
// reader goroutines).
func (r *Run) Handle(m *jupyter.Message, ch jupyter.Channel) {
	r.mu.Lock()
	if r.state == RunDone {
		r.mu.Unlock()
		return
	}
	if m.Type() == jupyter.InputRequest {
		r.awaiting = true
	}
	r.b.message(ch, m)
	r.mu.Unlock()
	r.persist()
}

// Start marks the run running.
func (r *Run) Start() bool {
	r.mu.Lock()
	if r.state != RunQueued {
		r.mu.Unlock()
		return false
	}
	r.state = RunRunning
	r.b.started = true
	r.mu.Unlock()
	r.persist()
	return true
}

// Finish closes the run with reason; only the first end counts.
func (r *Run) Finish(reason Reason, failure error) bool {
	return r.endWith(reason, failure, "")
}

// RequestDropped is the error name of a run its kernel never answered.
const RequestDropped = "RequestDropped"

// drop ends a run its kernel went idle for without answering it, while
// answering later requests: the code did not run as asked (ipykernel drops
// some requests whole), and the kernel keeps its state.
func (r *Run) drop() {
	r.mu.Lock()
	if r.state != RunDone {
		r.b.setError(errorContent{EName: RequestDropped, EValue: "the kernel went idle without answering this run, so its code did not run (or its answer was lost); the kernel and its state are kept", Traceback: []string{}})
	}
	r.mu.Unlock()
	r.Finish(Errored, nil)
}

// Lose ends a run whose kernel went away, saying why.
func (r *Run) Lose(why string) { r.endWith(Lost, nil, why) }

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
	if r.exitCode != nil {
		r.b.exec.Process.ExitCode = r.exitCode
	}
	if message == "" {
		message = r.notice
	}
	r.b.exec.Process.Message = message
	r.emitLocked("end", endEvent{r.b.exec.ExecutionCount, r.b.exec.Process, r.b.exec.Truncated})
	r.cancel, r.input, r.kill, r.closeInput = nil, nil, nil, nil
	if r.timer != nil {
		r.timer.Stop()
	}
	took, truncated := r.finished.Sub(r.created), r.b.exec.Truncated
	// The events and the Execution share the output: held once.
	r.kept = int64(r.eventMem)
	onEnd := r.onEnd
	r.mu.Unlock()
	r.persist()
	close(r.done)
	if r.observer != nil {
		r.observer.RunEnded(r.Language, reason, took, truncated)
	}
	if onEnd != nil {
		onEnd(r)
	}
	return true
}

// Memory is what the finished run's record holds, in bytes.
func (r *Run) Memory() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.kept
}

// refuse ends a run its queue refused: it never ran, and it is neither
// counted nor recorded.
func (r *Run) refuse(why error) {
	r.mu.Lock()
	if r.state == RunDone {
		r.mu.Unlock()
		return
	}
	r.state = RunDone
	r.failure = why
	r.finished = time.Now()
	r.cancel, r.input = nil, nil
	if r.timer != nil {
		r.timer.Stop()
	}
	r.mu.Unlock()
	close(r.done)
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
	if fn == nil || !(awaiting || r.anyInput) {
		return errorf(ErrNotAwaitingInput, "run %s is not waiting for input", r.ID)
	}
	return fn(value)
}

// Controls are how the driver of a run that is not code on a kernel (a
// command) lets it be stopped and fed.
type Controls struct {
	// Cancel stops the run: Interrupted, TimedOut or Killed.
	Cancel func(Reason)
	// Input writes to it; with AnyInput any input is taken, not only
	// answers to an input_request.
	Input    func(value string) error
	AnyInput bool
	// CloseInput ends its input.
	CloseInput func()
	// ExitCode: the run is a process of its own that ends with an exit
	// status (SetExitCode), and Kill cancels it with Killed.
	ExitCode bool
}

// SetControls sets how the run is stopped and fed; an ended run keeps none.
func (r *Run) SetControls(c Controls) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == RunDone {
		return
	}
	r.cancel, r.input, r.closeInput, r.anyInput = c.Cancel, c.Input, c.CloseInput, c.AnyInput
	if c.ExitCode && r.exitCode == nil {
		r.exitCode = new(int)
	}
	if c.ExitCode && c.Cancel != nil {
		// A process of its own: Kill ends it killed.
		r.kill = func() { c.Cancel(Killed) }
	}
}

// SetExitCode sets the exit status the run ends with (a run with
// Controls.ExitCode).
func (r *Run) SetExitCode(code int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.exitCode != nil {
		*r.exitCode = code
	}
}

// SetNotice sets the end's process message, unless the end gives one.
func (r *Run) SetNotice(notice string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notice = notice
}

// Output adds text to stream name (stdout or stderr) of a run.
func (r *Run) Output(name, text string) {
	r.mu.Lock()
	if r.state == RunDone {
		r.mu.Unlock()
		return
	}
	r.b.stream(name, text)
	r.mu.Unlock()
	r.persist()
}

// stopping notes that the run is being stopped for why (TimedOut or
// Interrupted): it ends so once its kernel stops it.
func (r *Run) stopping(why Reason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if why == TimedOut {
		r.timedOut = true
	} else {
		r.interrupted = true
	}
}

// followedReason is how a run followed without its reply (picked up
// after a restart) ended: as it was stopped, or by its error.
func (r *Run) followedReason() Reason {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.timedOut:
		return TimedOut
	case r.interrupted:
		return Interrupted
	case r.b.exec.Error != nil:
		return Errored
	}
	return Completed
}

// Kill sends SIGKILL to a running command's process group; the run ends
// "killed". A code run is not a process of its own: Kill interrupts it.
func (r *Run) Kill() {
	r.mu.Lock()
	kill := r.kill
	r.mu.Unlock()
	if kill != nil {
		kill()
		return
	}
	r.Interrupt()
}

// CloseInput closes a running command's standard input (it reads EOF);
// false when the run has no open input.
func (r *Run) CloseInput() bool {
	r.mu.Lock()
	closeInput := r.closeInput
	r.input, r.closeInput = nil, nil
	r.mu.Unlock()
	if closeInput == nil {
		return false
	}
	closeInput()
	return true
}

// Waited reports whether its caller waits for its end to answer (Spec.Wait):
// until then it has handed out nothing of the run, and a run that never
// started can be asked for again elsewhere.
func (r *Run) Waited() bool { return r.wait }

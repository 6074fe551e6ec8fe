package runs

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"

	"kernelgate/jupyter"
)

// NewID is the id of a new run: a UUID whose leading bits are its time
// (version 7), so that the store adds the records of new runs, and prunes
// those of the oldest, at the two ends of its keys instead of all over
// them (a random key dirtied a page of each of the store's trees per run
// and commit).
func NewID() string {
	if id, err := uuid.NewV7(); err == nil {
		return id.String()
	}
	return uuid.NewString()
}

// Host is the owner of a queue (a context): it hands the queue's runs
// their kernel.
type Host interface {
	// KernelReady reports whether the kernel's process is running and
	// connected now (not starting, restarting or being adopted).
	KernelReady() bool
	// Kernel returns the kernel to run on, starting one if there is none
	// or its process is gone.
	Kernel(ctx context.Context) (Kernel, error)
	// Restart gives the host a new kernel process: a run did not stop
	// after an interrupt.
	Restart(ctx context.Context) error
}

// Kernel is a kernel process as a run needs it.
type Kernel interface {
	// ID names the kernel; it stays across restarts of its process.
	ID() string
	// Generation is its process's generation, bumped by every start, and
	// how the previous process ended ("died (…)", "was restarted").
	Generation() (gen int, endedBy string)
	// Execute sends an execute_request with content, calling sending
	// with its msg_id just before, and routes what answers it to h;
	// ended, called once the run has ended, releases what the kernel
	// keeps for it. An error of sending (or of the kernel's own last
	// check, ErrNotSent) keeps the request from being sent, and is
	// returned.
	Execute(content jupyter.ExecuteContent, h jupyter.Handler, sending func(msgID string) error) (c Call, ended func(), err error)
	// Input answers the input_request parent with value.
	Input(value string, parent *jupyter.Message) error
	// Forget stops routing c's messages.
	Forget(c Call)
	Interrupt(ctx context.Context) error
	// LateWait is how long the process's output may follow its idle
	// status (0: it never does).
	LateWait() time.Duration
}

// Call is a request in flight (a *jupyter.Call).
type Call interface {
	Done() <-chan struct{}
	Result() (*jupyter.Message, error)
	Wait(ctx context.Context) (*jupyter.Message, error)
}

// QueueConfig is how a queue runs.
type QueueConfig struct {
	// Limit bounds the runs waiting; Kept the run ids it remembers.
	Limit, Kept int
	// InterruptGrace is how long a run has to stop after an interrupt
	// before its kernel is restarted; StartTimeout bounds that restart.
	InterruptGrace, StartTimeout time.Duration
	Log                          *slog.Logger
	// Go runs fn on a goroutine its owner waits for at shutdown; it is
	// never called with the queue's lock held.
	Go func(fn func())
	// NoInline: runs never run on the caller's goroutine (Execute's
	// wait); every run goes to a worker.
	NoInline bool
	// After is called on the worker after each run (nil: nothing).
	After func()
}

// Queue is the runs of one context: they run one at a time, in arrival
// order, on the kernel its Host hands them.
type Queue struct {
	id   string // the context's
	host Host
	cfg  QueueConfig

	mu      sync.Mutex
	queue   []*Run
	running *Run
	working bool
	closed  bool
	// diverted: every run is refused with it (Divert).
	diverted error
	runIDs   []string
	// The kernel and process generation the last run started on, and
	// whether a run has told that they were replaced since (a lost run
	// does): the next run on another process says its state is gone.
	ranOn  Kernel
	ranGen int
	told   bool
	// endedBefore says how the kernel of a context kept by an earlier
	// gateway ended, when it did not come back.
	endedBefore string
}

// NewQueue returns the empty queue of context id.
func NewQueue(id string, host Host, cfg QueueConfig) *Queue {
	return &Queue{id: id, host: host, cfg: cfg}
}

// Enqueue adds a run to the queue and makes sure a worker runs it.
func (q *Queue) Enqueue(r *Run) error {
	_, _, err := q.EnqueueRun(r, false)
	return err
}

// EnqueueRun queues r. With inline, when the queue is idle, it starts no
// worker and reports true: the caller runs r itself (WorkInline). first
// reports that r is the next to run: the queue was idle.
func (q *Queue) EnqueueRun(r *Run, inline bool) (bool, bool, error) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return false, false, errorf(ErrQueueClosed, "context %s was deleted", q.id)
	}
	if err := q.diverted; err != nil {
		q.mu.Unlock()
		return false, false, err
	}
	if limit := q.cfg.Limit; len(q.queue) >= limit {
		q.mu.Unlock()
		return false, false, errorf(ErrQueueFull, "context %s already has %d runs waiting; wait for them or use another context", q.id, limit)
	}
	q.queue = append(q.queue, r)
	q.noteRunLocked(r.ID)
	r.mu.Lock()
	r.cancel = func(reason Reason) { q.dequeue(r, reason) }
	r.mu.Unlock()
	first := !q.working
	inline = inline && !q.working && !q.cfg.NoInline
	startWorker := !q.working && !inline
	q.working = true
	q.mu.Unlock()
	// working is set: no other worker starts meanwhile. The owner's Go
	// is called without the queue's lock.
	if startWorker {
		q.cfg.Go(q.work)
	}
	r.ArmDeadline(r.Expire)
	return inline, first, nil
}

// NoteRun adds a run's id to the queue's runs (a command's, a restored
// run's), keeping the last Kept.
func (q *Queue) NoteRun(id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.noteRunLocked(id)
}

func (q *Queue) noteRunLocked(id string) {
	q.runIDs = append(q.runIDs, id)
	if over := len(q.runIDs) - q.cfg.Kept; over > 0 {
		// Drop the oldest from the front: append reallocates once the
		// room there is used, rather than every run copying the rest.
		clear(q.runIDs[:over])
		q.runIDs = q.runIDs[over:]
	}
}

// RunIDs are the ids of the queue's last runs, oldest first.
func (q *Queue) RunIDs() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]string{}, q.runIDs...)
}

// Len is how many runs wait.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}

// Running is the run on the kernel now, or nil.
func (q *Queue) Running() *Run {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.running
}

// Take empties the queue and returns what waited in it and what runs;
// the queue stays open.
func (q *Queue) Take() (queued []*Run, running *Run) {
	q.mu.Lock()
	defer q.mu.Unlock()
	queued, q.queue = q.queue, nil
	return queued, q.running
}

// Close closes the queue: no run is queued after. It returns what waited
// in it and what runs, for the caller to end.
func (q *Queue) Close() (queued []*Run, running *Run) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	queued, q.queue = q.queue, nil
	return queued, q.running
}

// Restored notes the kernel and generation the last run before a restart
// of the gateway ran on, or, with k nil, how its kernel ended.
func (q *Queue) Restored(k Kernel, endedBefore string) {
	gen := 0
	if k != nil {
		gen, _ = k.Generation()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if k != nil {
		q.ranOn, q.ranGen = k, gen
	}
	q.endedBefore = endedBefore
}

// ArmDeadline calls expire once r's deadline (if it has one) has passed;
// the timer is stopped when r ends, and not armed for a run that ended
// already.
func (r *Run) ArmDeadline(expire func()) {
	if r.deadline.IsZero() {
		return
	}
	t := time.AfterFunc(time.Until(r.deadline), expire)
	r.mu.Lock()
	if r.state == RunDone {
		t.Stop()
	} else {
		r.timer = t
	}
	r.mu.Unlock()
}

// dequeue ends a run that is still queued; a running one is left to its
// worker (which has replaced r.cancel).
func (q *Queue) dequeue(r *Run, reason Reason) {
	q.mu.Lock()
	found := false
	for i, x := range q.queue {
		if x == r {
			q.queue = append(q.queue[:i], q.queue[i+1:]...)
			found = true
			break
		}
	}
	if !found && q.running == r {
		// Taken by the worker but not started: it ends the run instead.
		r.mu.Lock()
		if r.state == RunQueued {
			r.stopBeforeStart = reason
		}
		r.mu.Unlock()
	}
	q.mu.Unlock()
	if found {
		r.Finish(reason, nil)
	}
}

// Expire is the run's timeout: a queued run ends without running, a
// running one is interrupted by its worker.
func (r *Run) Expire() {
	r.mu.Lock()
	cancel := r.cancel
	if r.state == RunRunning {
		r.timedOut = true
	}
	r.mu.Unlock()
	if cancel != nil {
		cancel(TimedOut)
	}
}

// work runs the queue until it is empty; one worker per queue at most.
func (q *Queue) work() { q.runQueue(false) }

// WorkInline runs the run the caller queued with EnqueueRun(r, true), on
// the caller's goroutine, and hands what was queued behind it to a worker:
// the caller waits for its own run only.
func (q *Queue) WorkInline() { q.runQueue(true) }

// deletedBeforeStart says why a run queued on a deleted context ends.
func (q *Queue) deletedBeforeStart() string {
	return "context " + q.id + " was deleted before the run started; it never ran"
}

// runQueue runs the queued runs in order until none is left (or, with
// justOne, hands the rest to a worker after the first).
func (q *Queue) runQueue(justOne bool) {
	for ran := false; ; ran = true {
		q.mu.Lock()
		if len(q.queue) == 0 || q.closed {
			q.working = false
			queued := q.queue
			q.queue = nil
			q.mu.Unlock()
			for _, r := range queued {
				r.Lose(q.deletedBeforeStart())
			}
			return
		}
		if ran && justOne {
			// The caller's run is done: a worker takes the rest (working
			// stays set for it).
			q.mu.Unlock()
			q.cfg.Go(q.work)
			return
		}
		r := q.queue[0]
		q.queue = q.queue[1:]
		q.running = r
		q.mu.Unlock()
		q.execute(r)
		q.mu.Lock()
		q.running = nil
		q.mu.Unlock()
		if q.cfg.After != nil {
			q.cfg.After()
		}
	}
}

// runContext bounds the start of a kernel for a run by the run's deadline.
func runContext(r *Run, parent context.Context) (context.Context, context.CancelFunc) {
	if r.deadline.IsZero() {
		return context.WithCancel(parent)
	}
	return context.WithDeadline(parent, r.deadline)
}

// execute runs r on the context's kernel and ends it.
func (q *Queue) execute(r *Run) {
	stop := make(chan Reason, 1)
	late := NewLateOutput()
	var beganOnce sync.Once
	// began is closed when the kernel says the code runs (execute_input).
	began := make(chan struct{})
	var pendingInput *jupyter.Message
	handle := func(ch jupyter.Channel, m *jupyter.Message) {
		if m.Type() == jupyter.ExecuteInput {
			beganOnce.Do(func() { close(began) })
		}
		if m.Type() == jupyter.InputRequest {
			r.mu.Lock()
			pendingInput = m
			r.mu.Unlock()
		}
		r.Handle(m, ch)
		late.Note(m)
	}
	content := jupyter.NewExecute(r.Code)
	content.AllowStdin = r.Stdin
	// Runs are independent: an error must not abort the next one.
	content.StopOnError = false

	var k Kernel
	var call Call
	// A kernel that dies between being handed out and taking the run is
	// replaced once: the run had not started.
	for attempt := 0; ; attempt++ {
		if (attempt > 0 || !q.host.KernelReady()) && !r.isDurable() && !r.wait {
			// It waits for a kernel: its record is committed now, so
			// that its id is handed out meanwhile (Execute).
			r.Promise()
		}
		ctx, cancel := runContext(r, context.Background())
		var err error
		k, err = q.host.Kernel(ctx)
		cancel()
		if err != nil {
			if !r.deadline.IsZero() && time.Now().After(r.deadline) {
				r.Finish(TimedOut, nil)
			} else {
				r.Finish(Lost, err)
			}
			return
		}
		// The answer to an input_request goes to this kernel: set before
		// the request is sent, as the input_request can come at once.
		kernel := k
		input := func(value string) error {
			r.mu.Lock()
			parent := pendingInput
			r.mu.Unlock()
			return kernel.Input(value, parent)
		}
		r.mu.Lock()
		if r.state != RunQueued {
			r.mu.Unlock()
			return
		}
		stopped := r.stopBeforeStart
		r.input = input
		r.mu.Unlock()
		if stopped == "" && !r.deadline.IsZero() && time.Now().After(r.deadline) {
			stopped = TimedOut
		}
		if stopped != "" {
			r.Finish(stopped, nil)
			return
		}
		var ended func()
		// The record names the request as the kernel gets it: a
		// gateway started again after a crash picks the run up. Its
		// commit goes on while the kernel runs the code; the run's id
		// leaves the gateway once it is durable (promiseSending).
		call, ended, err = k.Execute(content, handle, func(msgID string) error {
			r.mu.Lock()
			r.kernelID, r.msgID = kernel.ID(), msgID
			r.mu.Unlock()
			return r.promiseSending()
		})
		if err == nil {
			defer ended()
			break
		}
		if errors.Is(err, ErrNotSent) {
			// This replica may not act for the kernel: the run is the
			// owner's now, from the store; nothing of it is written here.
			q.cfg.Log.Warn("run not sent: this replica does not own the kernel", "context", q.id, "run", r.ID, "err", err)
			r.forget()
			q.Lose(r, notSent)
			return
		}
		if attempt > 0 || !errors.Is(err, jupyter.ErrKernelDied) {
			q.Lose(r, LostMessage(err))
			return
		}
	}
	notice := q.startedOn(k)
	r.mu.Lock()
	r.notice = notice
	r.cancel = func(reason Reason) {
		select {
		case stop <- reason:
		default:
		}
	}
	// A stop that came while the code was being sent found the run still
	// queued (dequeue): it is kept here rather than lost.
	stopped := r.stopBeforeStart
	cancel := r.cancel
	r.mu.Unlock()
	if stopped != "" {
		cancel(stopped)
	}
	if !r.Start() {
		k.Forget(call)
		return
	}
	// A deadline passed between the checks above and the start.
	if !r.deadline.IsZero() && time.Now().After(r.deadline) {
		r.Expire()
	}

	var grace, again <-chan time.Time
	var onBegin <-chan struct{}
	interrupt := func() {
		ictx, icancel := context.WithTimeout(context.Background(), q.cfg.InterruptGrace)
		if err := k.Interrupt(ictx); err != nil {
			q.cfg.Log.Info("interrupt failed", "context", q.id, "err", err)
		}
		icancel()
	}
	for {
		select {
		case <-call.Done():
			if _, err := call.Result(); errors.Is(err, jupyter.ErrRequestDropped) {
				// The kernel runs on with its state: the queue moves on.
				q.cfg.Log.Warn("the kernel went idle without answering a run; the run ends with an error, the kernel is kept", "context", q.id, "run", r.ID)
				r.drop()
				return
			} else if err != nil {
				q.cfg.Log.Info("run lost its kernel", "context", q.id, "run", r.ID, "err", err)
				q.Lose(r, LostMessage(err))
				return
			}
			late.Settle(k.LateWait())
			r.Finish(r.repliedReason(), nil)
			return
		case why := <-stop:
			r.stopping(why)
			if grace == nil {
				grace = time.After(q.cfg.InterruptGrace)
				again = time.After(q.cfg.InterruptGrace / 3)
				select {
				case <-began:
					interrupt()
				default:
					// ipykernel ignores a signal that comes before it
					// runs the code: interrupt once it does, so a
					// timeout shorter than the hand-over still bounds
					// the run. (Two signals close together could land
					// the second outside the handler, killing it.)
					onBegin = began
				}
			}
		case <-onBegin:
			interrupt()
			onBegin = nil
		case <-again:
			// A signal that lands before the code runs is ignored by
			// ipykernel: interrupt once more before giving up on it.
			interrupt()
			again = nil
		case <-grace:
			// The kernel did not stop: restart it; the run's state is lost.
			k.Forget(call)
			q.restartAfterInterrupt(r)
			q.Lose(r, "the kernel did not stop after an interrupt and was restarted; its state is gone")
			return
		}
	}
}

// startedOn records that a run starts on k's current process and returns
// what the run must say about it: that the process the previous run ran on
// was replaced and its state is gone, unless a lost run said so already.
func (q *Queue) startedOn(k Kernel) string {
	// The kernels are asked before the queue's lock is taken: only the
	// queue's one worker changes ranOn.
	id := k.ID()
	gen, endedBy := k.Generation()
	q.mu.Lock()
	prev := q.ranOn
	q.mu.Unlock()
	other := prev != nil && prev.ID() != id
	if other {
		_, endedBy = prev.Generation()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	notice := ""
	if prev != nil && (other || q.ranGen != gen) && !q.told {
		if endedBy == "" {
			endedBy = "was replaced"
		}
		notice = "the kernel " + endedBy + " after the previous run; this run started on a new kernel without the earlier state"
	}
	if prev == nil && q.endedBefore != "" && !q.told {
		notice = "the kernel " + q.endedBefore + " after the previous run; this run started on a new kernel without the earlier state"
	}
	q.endedBefore = ""
	q.ranOn, q.ranGen, q.told = k, gen, false
	return notice
}

// Lose ends a run of the queue whose kernel went away, saying why; its
// message tells the next run's caller too.
func (q *Queue) Lose(r *Run, why string) {
	q.mu.Lock()
	q.told = true
	q.mu.Unlock()
	r.Lose(why)
}

// restartAfterInterrupt restarts the kernel of a run that did not stop
// after an interrupt: the run's state is lost.
func (q *Queue) restartAfterInterrupt(r *Run) {
	q.cfg.Log.Warn("kernel did not stop after an interrupt: restarting it", "context", q.id, "run", r.ID)
	rctx, rcancel := context.WithTimeout(context.Background(), q.cfg.StartTimeout)
	if err := q.host.Restart(rctx); err != nil {
		q.cfg.Log.Info("restarting the kernel failed; the next run starts one", "context", q.id, "err", err)
	}
	rcancel()
}

// notSent is how a run this replica did not send ends here.
const notSent = "this replica does not own the context's kernel any more: the run was not sent here; the replica that owns the kernel now has it"

// LostMessage says why a run lost its kernel.
func LostMessage(err error) string {
	var died *jupyter.DiedError
	switch {
	case errors.As(err, &died) && died.Lost != "":
		return "the kernel's " + died.Lost + " connection ended and the kernel was stopped; the next run starts a new kernel without the earlier state"
	case errors.As(err, &died) && died.Reason != "":
		return "the kernel died (" + died.Reason + "); the next run starts a new kernel without the earlier state"
	case errors.As(err, &died):
		return "the kernel died (" + died.Status + "); the next run starts a new kernel without the earlier state"
	case errors.Is(err, jupyter.ErrKernelShutdown):
		return "the kernel was restarted or shut down; its state is gone"
	}
	return "the kernel went away: " + err.Error()
}

// LateOutput is what Settle hears of a run's messages.
type LateOutput struct {
	more       chan struct{} // a message of the run arrived
	result     chan struct{} // closed once its execute_result or error arrived
	resultOnce sync.Once
}

// NewLateOutput returns a LateOutput that heard nothing yet.
func NewLateOutput() *LateOutput {
	return &LateOutput{more: make(chan struct{}, 1), result: make(chan struct{})}
}

// Note hears a message of the run.
func (late *LateOutput) Note(m *jupyter.Message) {
	if m.Type() == jupyter.ExecuteResult || m.Type() == jupyter.ErrorMsg {
		late.resultOnce.Do(func() { close(late.result) })
	}
	select {
	case late.more <- struct{}{}:
	default:
	}
}

// Settle waits, for kernels known to publish output after their idle
// status (Deno), until no message of the run came for a short while, or
// until its execute_result (or error) has come: such a kernel publishes the
// result after the run's other output (stdout goes ahead of it, through the
// kernel's own stdio channel), so nothing of the run follows it.
// wait is the kernel's LateWait.
func (late *LateOutput) Settle(wait time.Duration) {
	if wait <= 0 {
		return
	}
	select {
	case <-late.result:
		return
	default:
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-late.result:
			return
		case <-late.more:
			t.Reset(wait)
		case <-t.C:
			return
		}
	}
}

// repliedReason says how a run that got its reply ended.
func (r *Run) repliedReason() Reason {
	r.mu.Lock()
	defer r.mu.Unlock()
	// The run's builder has read the reply: a call hands every message,
	// the reply too (even one made up after an interrupt), to its handler
	// before it ends.
	switch {
	case r.b.replyStatus == "ok":
		return Completed
	case r.timedOut:
		return TimedOut
	case r.interrupted:
		return Interrupted
	}
	return Errored
}

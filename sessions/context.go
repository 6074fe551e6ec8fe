package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"sync"
	"time"

	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
	"kernelgate/workspace"

	"kernelgate/internal/timefmt"
)

// Context is an interpreter context of the code-interpreter API: a kernel
// whose state runs share, with a queue that runs them one at a time in
// arrival order.
type Context struct {
	ID       string
	Language string
	Cwd      string
	Env      map[string]string
	Shared   bool // code-python, code-r, …, kernelspec-<name>
	Isolated bool // a one-run kernel, deleted after its run

	// pool gave an isolated context its kernel; it refills when the run ends.
	pool *pool
	// ws is the context's workspace; Cwd lies in it. Set before the
	// context is published, never changed.
	ws         *workspace.Workspace
	wsBorrowed bool // ws is shared (ContextRequest.Workspace): kept at delete
	// spare are the workspaces of pooled kernels the context took that
	// their kernel still uses (warm.go); deleted with the context.
	spare []*workspace.Workspace

	m       *Manager
	spec    *kernelspecs.Spec
	created time.Time

	mu      sync.Mutex
	kernel  *Kernel
	queue   []*Run
	running *Run
	working bool
	runIDs  []string
	deleted bool
	// The kernel and process generation the last run started on, and
	// whether a run has told that they were replaced since (a lost run
	// does): the next run on another process says its state is gone.
	ranOn  *Kernel
	ranGen int
	told   bool
	// endedBefore says how the kernel of a context kept by an earlier
	// gateway ended, when it did not come back (restore.go).
	endedBefore string
	// commands are the commands running beside its kernel (commands.go).
	commands map[*Run]*commandRun
	// tokens are the hashes of the context tokens minted for it
	// (KeepContextToken).
	tokens []ContextToken
}

// ContextModel is a context as the API shows it.
type ContextModel struct {
	ID              string   `json:"id"`
	Language        string   `json:"language"`
	Kernelspec      string   `json:"kernelspec"`
	Cwd             string   `json:"cwd"`
	Env             []string `json:"env"`
	Active          bool     `json:"active"`
	KernelID        *string  `json:"kernelId"`
	KernelProcessID *int     `json:"kernelProcessId"`
	ProcessIDs      []string `json:"processIds"`
	ExecutionState  string   `json:"executionState"`
	CreatedAt       string   `json:"createdAt"`
	LastActivity    string   `json:"lastActivity"`
}

// Model returns the context's model; active says whether its kernel is
// running now (if not, the next run starts one without the old state).
func (c *Context) Model() ContextModel {
	c.mu.Lock()
	k := c.kernel
	ids := append([]string{}, c.runIDs...)
	c.mu.Unlock()
	ids = c.m.keptRuns(ids)
	names := make([]string, 0, len(c.Env))
	for n := range c.Env {
		names = append(names, n)
	}
	sort.Strings(names)
	cm := ContextModel{
		ID: c.ID, Language: c.Language, Kernelspec: c.spec.Name, Cwd: c.Cwd, Env: names, ProcessIDs: ids,
		ExecutionState: "dead", CreatedAt: timefmt.Format(c.created), LastActivity: timefmt.Format(c.created),
	}
	if k != nil {
		km := k.Model()
		id := k.id
		cm.KernelID = &id
		cm.ExecutionState = km.ExecutionState
		cm.LastActivity = km.LastActivity
		if pid := k.PID(); pid > 0 {
			cm.Active = true
			cm.KernelProcessID = &pid
		}
		if k.Running() {
			cm.Active = true
		}
	}
	return cm
}

// kernelFor returns the context's kernel, starting one if it has none or
// its process is gone (a run after a death gets a fresh kernel).
func (c *Context) ensureKernel(ctx context.Context) (*Kernel, process, error) {
	c.mu.Lock()
	k := c.kernel
	c.mu.Unlock()
	if k != nil {
		jk, err := k.ensure(ctx)
		if err == nil {
			return k, jk, nil
		}
		if !errors.Is(err, ErrKernelGone) {
			return nil, nil, err
		}
	}
	// No kernel, or it was deleted through the Jupyter API: take a ready
	// one from the pool, or start another.
	k = c.takeWarm(ctx)
	if k == nil {
		var err error
		if k, err = c.m.startKernel(ctx, newID(), c.spec, c.Env, workDir{ws: c.ws, cwd: c.Cwd}, restartLazily); err != nil {
			return nil, nil, err
		}
	}
	c.mu.Lock()
	if c.deleted {
		c.mu.Unlock()
		c.m.ShutdownKernel(context.Background(), k.id)
		return nil, nil, errorf(ErrNoSuchContext, "context %s was deleted", c.ID)
	}
	c.kernel = k
	c.mu.Unlock()
	c.m.putContext(c)
	jk, err := k.running(ctx)
	return k, jk, err
}

// enqueue adds a run to the queue and makes sure a worker runs it.
func (c *Context) enqueue(r *Run) error {
	_, _, err := c.enqueueRun(r, false)
	return err
}

// enqueueRun queues r. With inline, when the context is idle, it starts
// no worker and reports true: the caller runs r itself (workInline).
// first reports that r is the next to run: the context was idle.
func (c *Context) enqueueRun(r *Run, inline bool) (bool, bool, error) {
	c.mu.Lock()
	if c.deleted {
		c.mu.Unlock()
		return false, false, errorf(ErrNoSuchContext, "context %s was deleted", c.ID)
	}
	if limit := c.m.cfg.QueueLimit; len(c.queue) >= limit {
		c.mu.Unlock()
		return false, false, errorf(ErrQueueFull, "context %s already has %d runs waiting; wait for them or use another context", c.ID, limit)
	}
	c.queue = append(c.queue, r)
	c.noteRunLocked(r.ID)
	r.mu.Lock()
	r.cancel = func(reason Reason) { c.dequeue(r, reason) }
	r.mu.Unlock()
	first := !c.working
	inline = inline && !c.working && !c.Isolated
	if !c.working {
		c.working = true
		if !inline {
			c.m.goroutine(c.work)
		}
	}
	c.mu.Unlock()
	r.armDeadline(r.expire)
	return inline, first, nil
}

// noteRunLocked adds a run's id to c's runs, keeping the last RunsKept;
// c.mu is held.
func (c *Context) noteRunLocked(id string) {
	c.runIDs = append(c.runIDs, id)
	if over := len(c.runIDs) - c.m.cfg.RunsKept; over > 0 {
		// Drop the oldest from the front: append reallocates once the
		// room there is used, rather than every run copying the rest.
		clear(c.runIDs[:over])
		c.runIDs = c.runIDs[over:]
	}
}

// armDeadline calls expire once r's deadline (if it has one) has passed;
// the timer is stopped when r ends, and not armed for a run that ended
// already.
func (r *Run) armDeadline(expire func()) {
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

// kernelReady reports whether the context's kernel process is running and
// connected (not starting, restarting or being adopted).
func (c *Context) kernelReady() bool {
	c.mu.Lock()
	k := c.kernel
	c.mu.Unlock()
	if k == nil {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.jk != nil
}

// dequeue ends a run that is still queued; a running one is left to its
// worker (which has replaced r.cancel).
func (c *Context) dequeue(r *Run, reason Reason) {
	c.mu.Lock()
	found := false
	for i, q := range c.queue {
		if q == r {
			c.queue = append(c.queue[:i], c.queue[i+1:]...)
			found = true
			break
		}
	}
	if !found && c.running == r {
		// Taken by the worker but not started: it ends the run instead.
		r.mu.Lock()
		if r.state == RunQueued {
			r.stopBeforeStart = reason
		}
		r.mu.Unlock()
	}
	c.mu.Unlock()
	if found {
		r.end(reason, nil)
	}
}

// expire is the run's timeout: a queued run ends without running, a
// running one is interrupted by its worker.
func (r *Run) expire() {
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

// work runs the queue until it is empty; one worker per context at most.
func (c *Context) work() { c.runQueue(false) }

// workInline runs the run the caller queued with enqueueRun(r, true), on
// the caller's goroutine, and hands what was queued behind it to a worker:
// the caller waits for its own run only.
func (c *Context) workInline() {
	c.m.wg.Add(1)
	defer c.m.wg.Done()
	c.runQueue(true)
}

// runQueue runs the queued runs in order until none is left (or, with
// justOne, hands the rest to a worker after the first).
func (c *Context) runQueue(justOne bool) {
	for ran := false; ; ran = true {
		c.mu.Lock()
		if len(c.queue) == 0 || c.deleted {
			c.working = false
			queued := c.queue
			c.queue = nil
			c.mu.Unlock()
			for _, r := range queued {
				r.lose(deletedBeforeStart(c))
			}
			return
		}
		if ran && justOne {
			// The caller's run is done: a worker takes the rest.
			c.m.goroutine(c.work)
			c.mu.Unlock()
			return
		}
		r := c.queue[0]
		c.queue = c.queue[1:]
		c.running = r
		c.mu.Unlock()
		c.execute(r)
		c.mu.Lock()
		c.running = nil
		c.mu.Unlock()
		if c.Isolated {
			// The kernel's place under MaxKernels is free once its
			// process is gone: the pool refills after.
			c.m.deleteContext(context.Background(), c, false)
			if c.pool != nil {
				c.pool.refill()
			}
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
func (c *Context) execute(r *Run) {
	stop := make(chan Reason, 1)
	late := lateOutput{more: make(chan struct{}, 1), result: make(chan struct{})}
	var resultOnce, beganOnce sync.Once
	// began is closed when the kernel says the code runs (execute_input).
	began := make(chan struct{})
	var pendingInput *Message
	handle := func(ch jupyter.Channel, m *Message) {
		if m.Type() == jupyter.ExecuteInput {
			beganOnce.Do(func() { close(began) })
		}
		if m.Type() == jupyter.InputRequest {
			r.mu.Lock()
			pendingInput = m
			r.mu.Unlock()
		}
		r.handle(m, ch)
		if m.Type() == jupyter.ExecuteResult || m.Type() == jupyter.ErrorMsg {
			resultOnce.Do(func() { close(late.result) })
		}
		select {
		case late.more <- struct{}{}:
		default:
		}
	}
	content := jupyter.NewExecute(r.Code)
	content.AllowStdin = r.Stdin
	// Runs are independent: an error must not abort the next one.
	content.StopOnError = false

	var k *Kernel
	var jk process
	var call call
	// A kernel that dies between being handed out and taking the run is
	// replaced once: the run had not started.
	for attempt := 0; ; attempt++ {
		if (attempt > 0 || !c.kernelReady()) && !r.isDurable() && !r.wait {
			// It waits for a kernel: its record is committed now, so
			// that its id is handed out meanwhile (Execute).
			r.promise()
		}
		ctx, cancel := runContext(r, context.Background())
		var err error
		k, jk, err = c.ensureKernel(ctx)
		cancel()
		if err != nil {
			if !r.deadline.IsZero() && time.Now().After(r.deadline) {
				r.end(TimedOut, nil)
			} else {
				r.end(Lost, err)
			}
			return
		}
		// The answer to an input_request goes to this kernel: set before
		// the request is sent, as the input_request can come at once.
		input := func(value string) error {
			r.mu.Lock()
			parent := pendingInput
			r.mu.Unlock()
			m, err := jk.NewMessage(jupyter.InputReply, map[string]string{"value": value}, parent)
			if err != nil {
				return err
			}
			return jk.Send(jupyter.Stdin, m)
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
			r.end(stopped, nil)
			return
		}
		var ended func()
		// The record names the request as the kernel gets it: a
		// gateway started again after a crash picks the run up. Its
		// commit goes on while the kernel runs the code; the run's id
		// leaves the gateway once it is durable (promiseSending).
		call, ended, err = k.startRun(jk, content, handle, func(msgID string) {
			r.mu.Lock()
			r.kernelID, r.msgID = k.id, msgID
			r.mu.Unlock()
			r.promiseSending()
		})
		if err == nil {
			defer ended()
			break
		}
		if attempt > 0 || !errors.Is(err, jupyter.ErrKernelDied) {
			c.lose(r, lostMessage(err))
			return
		}
	}
	r.mu.Lock()
	r.notice = c.startedOn(k)
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
	if !r.start() {
		jk.Forget(call)
		return
	}
	// A deadline passed between the checks above and the start.
	if !r.deadline.IsZero() && time.Now().After(r.deadline) {
		r.expire()
	}

	var grace, again <-chan time.Time
	var onBegin <-chan struct{}
	interrupt := func() {
		ictx, icancel := context.WithTimeout(context.Background(), c.m.cfg.InterruptGrace)
		if err := k.Interrupt(ictx); err != nil {
			c.m.log.Info("interrupt failed", "context", c.ID, "err", err)
		}
		icancel()
	}
	for {
		select {
		case <-call.Done():
			if _, err := call.Result(); errors.Is(err, jupyter.ErrRequestDropped) {
				// The kernel runs on with its state: the queue moves on.
				c.m.log.Warn("the kernel went idle without answering a run; the run ends with an error, the kernel is kept", "context", c.ID, "run", r.ID)
				r.drop()
				return
			} else if err != nil {
				c.m.log.Info("run lost its kernel", "context", c.ID, "run", r.ID, "err", err)
				c.lose(r, lostMessage(err))
				return
			}
			c.settle(k, late)
			r.end(c.reason(r), nil)
			return
		case why := <-stop:
			r.mu.Lock()
			if why == TimedOut {
				r.timedOut = true
			} else {
				r.interrupted = true
			}
			r.mu.Unlock()
			if grace == nil {
				grace = time.After(c.m.cfg.InterruptGrace)
				again = time.After(c.m.cfg.InterruptGrace / 3)
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
			c.m.log.Warn("kernel did not stop after an interrupt: restarting it", "context", c.ID, "run", r.ID)
			jk.Forget(call)
			rctx, rcancel := context.WithTimeout(context.Background(), c.m.cfg.StartTimeout)
			if err := c.restart(rctx); err != nil {
				c.m.log.Info("restarting the kernel failed; the next run starts one", "context", c.ID, "err", err)
			}
			rcancel()
			c.lose(r, "the kernel did not stop after an interrupt and was restarted; its state is gone")
			return
		}
	}
}

// startedOn records that a run starts on k's current process and returns
// what the run must say about it: that the process the previous run ran on
// was replaced and its state is gone, unless a lost run said so already.
func (c *Context) startedOn(k *Kernel) string {
	gen, endedBy := k.generation()
	c.mu.Lock()
	defer c.mu.Unlock()
	notice := ""
	if c.ranOn != nil && (c.ranOn != k || c.ranGen != gen) && !c.told {
		if c.ranOn != k {
			_, endedBy = c.ranOn.generation()
		}
		if endedBy == "" {
			endedBy = "was replaced"
		}
		notice = "the kernel " + endedBy + " after the previous run; this run started on a new kernel without the earlier state"
	}
	if c.ranOn == nil && c.endedBefore != "" && !c.told {
		notice = "the kernel " + c.endedBefore + " after the previous run; this run started on a new kernel without the earlier state"
	}
	c.endedBefore = ""
	c.ranOn, c.ranGen, c.told = k, gen, false
	return notice
}

// lose ends a run whose kernel went away, saying why; its message tells
// the next run's caller too.
func (c *Context) lose(r *Run, why string) {
	c.mu.Lock()
	c.told = true
	c.mu.Unlock()
	r.lose(why)
}

// lostMessage says why a run lost its kernel.
func lostMessage(err error) string {
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

// lateOutput is what settle hears of a run's messages.
type lateOutput struct {
	more   chan struct{} // a message of the run arrived
	result chan struct{} // closed once its execute_result or error arrived
}

// settle waits, for kernels known to publish output after their idle
// status (Deno), until no message of the run came for a short while, or
// until its execute_result (or error) has come: such a kernel publishes the
// result after the run's other output (stdout goes ahead of it, through the
// kernel's own stdio channel), so nothing of the run follows it.
func (c *Context) settle(k *Kernel, late lateOutput) {
	k.mu.Lock()
	wait := k.lateWait
	k.mu.Unlock()
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

// reason says how a run that got its reply ended.
func (c *Context) reason(r *Run) Reason {
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

// interrupt interrupts the running run, if any.
func (c *Context) interrupt(ctx context.Context) error {
	c.mu.Lock()
	running, k := c.running, c.kernel
	c.mu.Unlock()
	if running != nil {
		running.Interrupt()
		return nil
	}
	if k != nil && k.Running() {
		return k.Interrupt(ctx)
	}
	return nil
}

// restart gives the context a new kernel process: state is gone, the id
// stays. It is the one way a context's kernel is restarted: on request,
// and when a run does not stop after an interrupt.
func (c *Context) restart(ctx context.Context) error {
	c.mu.Lock()
	k, deleted := c.kernel, c.deleted
	c.mu.Unlock()
	if deleted {
		return errorf(ErrNoSuchContext, "context %s was deleted", c.ID)
	}
	if k != nil {
		if err := k.Restart(ctx); !errors.Is(err, ErrKernelGone) {
			return err
		}
	}
	// No kernel yet, or it was shut down through the Jupyter API: start one.
	_, _, err := c.ensureKernel(ctx)
	return err
}

// setupCode returns code that applies cwd and env inside a running kernel
// of spec's language, or false when the language has no such code.
func setupCode(spec *kernelspecs.Spec, cwd string, env map[string]string) (string, bool) {
	if cwd == "" && len(env) == 0 {
		return "", true
	}
	cwdJS, _ := json.Marshal(cwd)
	envJS, _ := json.Marshal(env)
	if env == nil {
		envJS = []byte("{}")
	}
	switch strings.ToLower(spec.Language) {
	case "python":
		code := "import os as _kg_os\n"
		if cwd != "" {
			code += "_kg_os.chdir(" + string(cwdJS) + ")\n"
		}
		return code + "_kg_os.environ.update(" + string(envJS) + ")\ndel _kg_os\n", true
	case "typescript", "javascript":
		code := ""
		if cwd != "" {
			code += "Deno.chdir(" + string(cwdJS) + ");\n"
		}
		return code + "for (const [k, v] of Object.entries(" + string(envJS) + ")) Deno.env.set(k, v);\n", true
	case "r":
		// A JSON string is an R string literal too (R reads \", \\, \n,
		// \uXXXX and the rest of JSON's escapes).
		code := ""
		if cwd != "" {
			code += "setwd(" + string(cwdJS) + ")\n"
		}
		if len(env) > 0 {
			names := make([]string, 0, len(env))
			for k := range env {
				names = append(names, k)
			}
			sort.Strings(names)
			args := make([]string, 0, len(env))
			for _, k := range names {
				kJS, _ := json.Marshal(k)
				vJS, _ := json.Marshal(env[k])
				args = append(args, string(kJS)+" = "+string(vJS))
			}
			code += "invisible(do.call(Sys.setenv, list(" + strings.Join(args, ", ") + ")))\n"
		}
		return code, true
	}
	return "", false
}

// Created is when the context was created; a context made again under the
// same id has another.
func (c *Context) Created() time.Time { return c.created }

// KernelID is the id of the context's current kernel, or "".
func (c *Context) KernelID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kernel == nil {
		return ""
	}
	return c.kernel.id
}

package sessions

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
	"kernelgate/provision/local"
	"kernelgate/runs"
	"kernelgate/workspace"

	"kernelgate/internal/timefmt"
)

// KernelModel is a kernel as the Jupyter REST API shows it.
type KernelModel struct {
	ID             string `json:"id"`
	Name           string `json:"name"`
	LastActivity   string `json:"last_activity"`
	ExecutionState string `json:"execution_state"`
	Connections    int    `json:"connections"`
	Reason         string `json:"reason,omitempty"`
	// Replica is the advertised URL of the replica that owns the kernel,
	// when several serve one store.
	Replica string `json:"replica,omitempty"`
}

// restartPolicy says what happens when a kernel's process dies.
type restartPolicy int

const (
	// restartNow restarts it at once, a bounded number of times (the
	// Jupyter surface: clients see status restarting, then a new kernel).
	restartNow restartPolicy = iota
	// restartLazily leaves it dead until the next run asks for it (the
	// contexts of the code-interpreter API, whose callers are told the
	// state was lost).
	restartLazily
)

// Kernel is a kernel the gateway manages under a stable id. Its process
// may be restarted (a new jupyter.Kernel each time); clients stay attached.
type Kernel struct {
	id      string
	spec    *kernelspecs.Spec
	m       *Manager
	env     map[string]string
	cwd     string
	ws      *workspace.Workspace // the workspace cwd lies in, or nil
	created time.Time
	policy  restartPolicy
	limits  *local.Limits
	sandbox *local.SandboxConfig

	// life serialises start, restart and shutdown.
	life sync.Mutex

	mu       sync.Mutex
	jk       process
	gen      int           // process generation, bumped by every start
	endedBy  string        // how the last process ended ("died (…)", "was restarted")
	ready    chan struct{} // non-nil while a (re)start is in progress
	state    jupyter.ExecutionState
	reason   string
	lastAct  time.Time
	clients  map[*Client]struct{}
	offline  runs.Outbox
	restarts []time.Time
	orphans  []*callRef
	removed  bool
	// lateWait is how long the process's output may follow its idle
	// status (0: it never does); holds follow client requests meanwhile.
	lateWait time.Duration
	holds    map[string]*idleHold
	idles    [8]idleSeen // recent idle statuses (noteLateLocked)
	idleNext int

	// recordedAct is the last activity the store's record holds; the
	// checkpoint is woken once lastAct is CheckpointInterval past it.
	recordedAct time.Time
	// runs are the execute_requests of code-interpreter runs in flight:
	// their output is kept by the run, not again in the replay buffer.
	runs map[string]struct{}
	// commands is how many commands run beside the kernel: a kernel with
	// commands running is not idle (commands.go).
	commands int
	// pickups get the iopub messages of runs an earlier gateway started
	// (by the execute_request's id; restore.go).
	pickups map[string]func(*Message)
	// adopting is set while a kept kernel that has not answered yet is
	// being connected to (restore.go); ready is then open.
	adopting *adoption
}

// newKernel makes a kernel record; it starts nothing.
func (m *Manager) newKernel(id string, spec *kernelspecs.Spec, env map[string]string, wd workDir, policy restartPolicy) (*Kernel, error) {
	limits, sandbox, err := m.catalog.isolation(spec)
	if err == nil {
		_, err = m.catalog.lateOutputWait(spec, "")
	}
	if err != nil {
		return nil, errorf(ErrKernelStart, "%v", err)
	}
	if err := m.own(id); err != nil {
		return nil, errorf(ErrKernelStart, "%v", err)
	}
	now := time.Now()
	return &Kernel{
		id: id, spec: spec, m: m, env: env, cwd: wd.cwd, ws: wd.ws, created: now, policy: policy,
		limits: limits, sandbox: sandbox,
		state:   jupyter.StateStarting,
		lastAct: now,
		clients: make(map[*Client]struct{}),
		offline: runs.NewOutbox(m.cfg.ReplayMessages, m.cfg.ReplayBytes),
	}, nil
}

// ID is the kernel's id.
func (k *Kernel) ID() string { return k.id }

// SpecName is the name of its kernelspec.
func (k *Kernel) SpecName() string { return k.spec.Name }

// Model returns the kernel's REST model.
func (k *Kernel) Model() KernelModel {
	k.mu.Lock()
	defer k.mu.Unlock()
	return KernelModel{
		ID:             k.id,
		Name:           k.spec.Name,
		LastActivity:   timefmt.Format(k.lastAct),
		ExecutionState: string(k.state),
		Connections:    len(k.clients),
		Reason:         k.reason,
		Replica:        k.m.replicaURL(),
	}
}

// PID is the local process id of the running kernel (or of the kept one
// being adopted), or 0.
func (k *Kernel) PID() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case k.jk != nil:
		return k.jk.PID()
	case k.adopting != nil:
		return k.adopting.conn.PID()
	}
	return 0
}

// Running reports whether the kernel process is up (a kept one being
// adopted is).
func (k *Kernel) Running() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.jk != nil || k.adopting != nil
}

func (k *Kernel) config() jupyter.Config {
	// A kernel with a workspace is started with the whole workspace
	// reachable (bound writable in a sandbox) and moved into its cwd.
	cwd := k.cwd
	if k.ws != nil {
		cwd = k.ws.Dir()
	}
	return jupyter.Config{ID: k.id, Spec: k.spec, Env: k.env, DirEnv: dirEnv(k.ws), Cwd: cwd, StartFresh: k.chdirCode() != "", Kind: k.kind(),
		Logger: k.m.log, IOPub: k.onIOPub, Options: &local.Options{Limits: k.limits, Sandbox: k.sandbox}, MaxFrame: k.m.cfg.MaxKernelFrame,
		// Output larger than what a run or the replay buffer keeps is cut
		// as it is read: nothing would keep more of it.
		KeepOutput:       int64(max(k.m.cfg.RunLimits.LogBytes, k.m.cfg.ReplayBytes)),
		KeepResults:      int64(max(k.m.cfg.RunLimits.ResultBytes, k.m.cfg.ReplayBytes)),
		HeartbeatTimeout: max(k.m.cfg.HeartbeatTimeout, 0), HeartbeatPeriod: k.m.cfg.HeartbeatPeriod}
}

// chdirCode is the code that moves a kernel started in a fresh directory
// into its working directory, or "" when the kernel starts there (no
// working directory chosen, or a language without such code).
func (k *Kernel) chdirCode() string {
	if k.cwd == "" {
		return ""
	}
	code, ok := setupCode(k.spec, k.cwd, nil)
	if !ok {
		return ""
	}
	return k.m.catalog.packageCode(k.spec, k.ws) + code
}

// enterCwd moves a freshly started kernel into its working directory.
func (k *Kernel) enterCwd(ctx context.Context, jk process) error {
	code := k.chdirCode()
	if code == "" {
		return nil
	}
	content := jupyter.NewExecute(code)
	content.Silent, content.StoreHistory, content.StopOnError = true, false, false
	call, err := startExecute(jk, content, nil)
	if err != nil {
		return err
	}
	reply, err := call.Wait(ctx)
	if err != nil {
		jk.Forget(call)
		return err
	}
	var r struct{ Status, EValue string }
	reply.DecodeContent(&r)
	if r.Status != "ok" {
		return fmt.Errorf("entering %s: %s", k.cwd, r.EValue)
	}
	return nil
}

// launch starts a process for the kernel; the caller holds k.life.
func (k *Kernel) launch(ctx context.Context) error {
	k.mu.Lock()
	if k.removed {
		k.mu.Unlock()
		return ErrKernelGone
	}
	if k.ready == nil {
		k.ready = make(chan struct{})
	}
	k.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, k.m.cfg.StartTimeout)
	defer cancel()
	t0 := time.Now()
	jk, err := k.m.start(ctx, k.config())
	if err == nil {
		if err = k.enterCwd(ctx, jk); err != nil {
			jk.Shutdown(context.Background())
			err = fmt.Errorf("%w: %v", jupyter.ErrStartFailed, err)
		}
	}
	k.m.cfg.Observer.KernelStarted(k.spec.Name, time.Since(t0), err)

	k.mu.Lock()
	close(k.ready)
	k.ready = nil
	if err != nil {
		k.state = jupyter.StateDead
		k.reason = err.Error()
		slow := k.pushStatusLocked(jupyter.StateDead)
		k.mu.Unlock()
		cut(slow)
		return startError(err)
	}
	if k.removed {
		k.mu.Unlock()
		go jk.Shutdown(context.Background())
		return ErrKernelGone
	}
	k.jk = jk
	k.lateWait, _ = k.m.catalog.lateOutputWait(k.spec, jk.Info().Implementation)
	k.gen++
	k.state = jupyter.StateIdle
	k.reason = ""
	k.lastAct = time.Now()
	k.m.goroutine(func() { k.watch(jk) })
	k.mu.Unlock()
	k.m.records.putKernel(k, jk)
	return nil
}

// startError turns a start failure into an API error carrying the
// kernel's last output.
func startError(err error) error {
	switch {
	case errors.Is(err, jupyter.ErrEnvNotAllowed):
		return &Error{Kind: ErrInvalidEnv, Msg: err.Error()}
	case errors.Is(err, jupyter.ErrStartTimeout), errors.Is(err, context.DeadlineExceeded):
		return &Error{Kind: ErrStartTimeout, Msg: "the kernel did not start in time: " + err.Error()}
	case errors.Is(err, ErrKernelGone):
		return err
	}
	return &Error{Kind: ErrKernelStart, Msg: err.Error()}
}

// watch waits for a process to end and handles its death.
func (k *Kernel) watch(jk process) {
	select {
	case <-jk.Done():
	case <-k.m.closing:
		return
	}
	err := jk.Err()
	if errors.Is(err, jupyter.ErrKernelShutdown) {
		return
	}
	// Forget the dead process first, so no run is sent to it, then reap
	// it and remove what it left behind.
	k.died(jk, err)
	jk.Shutdown(context.Background())
}

// died records a process death and restarts the kernel per its policy.
func (k *Kernel) died(jk process, err error) {
	k.life.Lock()
	defer k.life.Unlock()
	k.mu.Lock()
	if k.jk != jk || k.removed {
		k.mu.Unlock()
		return
	}
	k.jk = nil
	k.endedBy = "died (" + deathDetail(err) + ")"
	held := k.releaseAllLocked()
	k.m.log.Warn("kernel died", "kernel", k.id, "spec", k.spec.Name, "err", err)
	k.m.cfg.Observer.KernelDied(k.spec.Name)
	now := time.Now()
	recent := k.restarts[:0]
	for _, t := range k.restarts {
		if now.Sub(t) < k.m.cfg.RestartWindow {
			recent = append(recent, t)
		}
	}
	k.restarts = recent
	restart := k.policy == restartNow && len(k.restarts) < k.m.cfg.RestartLimit
	if restart {
		k.restarts = append(k.restarts, now)
		k.state = jupyter.StateRestarting
		k.ready = make(chan struct{})
	} else {
		k.state = jupyter.StateDead
		k.reason = err.Error()
	}
	slow := append(held, k.pushStatusLocked(k.state)...)
	k.mu.Unlock()
	cut(slow)
	if restart {
		k.m.cfg.Observer.KernelRestarted(k.spec.Name, "died")
		if err := k.launch(context.Background()); err != nil {
			k.m.log.Warn("kernel restart failed", "kernel", k.id, "err", err)
		} else {
			k.m.log.Info("kernel restarted after it died", "kernel", k.id)
		}
	}
}

// running returns the kernel's process, waiting while it starts or
// restarts.
func (k *Kernel) running(ctx context.Context) (process, error) {
	for {
		k.mu.Lock()
		jk, ready, removed := k.jk, k.ready, k.removed
		reason := k.reason
		k.mu.Unlock()
		if jk != nil {
			// A process that died but whose watcher has not caught up yet
			// is handled here, so nothing is sent to it.
			if err := jk.Err(); err != nil && !errors.Is(err, jupyter.ErrKernelShutdown) {
				k.died(jk, err)
				continue
			}
		}
		switch {
		case removed:
			return nil, ErrKernelGone
		case jk != nil:
			return jk, nil
		case ready == nil:
			return nil, &Error{Kind: ErrKernelDead, Msg: "the kernel is dead: " + reason}
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, &Error{Kind: ErrTimeout, Msg: "the kernel is still starting"}
		}
	}
}

// ensure returns the kernel's process like running, but first starts a
// new one when a kernel of the lazy policy is dead.
func (k *Kernel) ensure(ctx context.Context) (process, error) {
	jk, err := k.running(ctx)
	if !errors.Is(err, ErrKernelDead) || k.policy != restartLazily {
		return jk, err
	}
	k.life.Lock()
	k.mu.Lock()
	dead := k.jk == nil && k.ready == nil && !k.removed
	if dead {
		k.state = jupyter.StateStarting
		k.reason = ""
	}
	k.mu.Unlock()
	if dead {
		err = k.launch(ctx)
	}
	k.life.Unlock()
	if err != nil {
		return nil, err
	}
	return k.running(ctx)
}

// Interrupt interrupts the kernel (signal or message, per its spec).
func (k *Kernel) Interrupt(ctx context.Context) error {
	k.mu.Lock()
	a := k.adopting
	k.mu.Unlock()
	if a != nil {
		if err := a.conn.Interrupt(ctx); err != nil {
			return &Error{Kind: ErrTimeout, Msg: "interrupting the kernel: " + err.Error()}
		}
		return nil
	}
	jk, err := k.running(ctx)
	if err != nil {
		return err
	}
	if err := jk.Interrupt(ctx); err != nil {
		return &Error{Kind: ErrTimeout, Msg: "interrupting the kernel: " + err.Error()}
	}
	return nil
}

// Restart replaces the kernel's process with a new one: state is lost, the
// id and the attached clients stay.
func (k *Kernel) Restart(ctx context.Context) error {
	left := k.cancelAdoption()
	k.life.Lock()
	defer k.life.Unlock()
	k.mu.Lock()
	if k.removed {
		k.mu.Unlock()
		return ErrKernelGone
	}
	jk := k.jk
	k.jk = nil
	// As in jupyter_server, clients learn of a requested restart from the
	// new process's status, not from a pushed one (that means it died).
	k.state = jupyter.StateRestarting
	k.ready = make(chan struct{})
	k.restarts = nil
	k.endedBy = "was restarted"
	held := k.releaseAllLocked()
	k.mu.Unlock()
	cut(held)
	if jk == nil && left != nil {
		k.stopAdoptee(ctx, left)
	}
	if jk != nil {
		jk.Shutdown(ctx)
	}
	k.m.cfg.Observer.KernelRestarted(k.spec.Name, "requested")
	return k.launch(ctx)
}

// generation is the kernel's process generation and how the process
// before it ended.
func (k *Kernel) generation() (int, string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.gen, k.endedBy
}

// deathDetail says in a few words why a process died.
func deathDetail(err error) string {
	var died *jupyter.DiedError
	switch {
	case errors.As(err, &died) && died.Lost != "":
		return "its " + died.Lost + " connection ended"
	case errors.As(err, &died) && died.Reason != "":
		return died.Reason
	case errors.As(err, &died):
		return died.Status
	}
	return err.Error()
}

// shutdown stops the kernel for good and disconnects its clients.
func (k *Kernel) shutdown(ctx context.Context) {
	left := k.cancelAdoption()
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
	k.endedBy = "was shut down"
	k.state = jupyter.StateDead
	slow := append(k.releaseAllLocked(), k.pushStatusLocked(jupyter.StateDead)...)
	clients := k.clients
	k.clients = map[*Client]struct{}{}
	k.mu.Unlock()
	cut(slow)
	for c := range clients {
		c.closeWith(ErrKernelGone)
	}
	if jk != nil {
		jk.Shutdown(ctx)
	} else if left != nil {
		k.stopAdoptee(ctx, left)
	}
	k.m.records.deleteKernel(k.id)
}

// onIOPub is subscribed to every process of the kernel: it keeps the
// kernel's state and activity and fans each message out to the clients,
// or to the replay buffer while none is connected.
func (k *Kernel) onIOPub(m *Message) {
	now := time.Now()
	state := m.ExecutionState()
	k.mu.Lock()
	if k.removed {
		k.mu.Unlock()
		return
	}
	if state != "" && k.jk != nil && state != jupyter.StateStarting {
		k.state = state
	}
	k.lastAct = now
	behind := k.behindLocked()
	raised := k.noteLateLocked(m, now)
	held, slow := k.holdLocked(m, now)
	if !held {
		slow = k.deliverLocked(runs.Outgoing{Channel: IOPub, Msg: m})
	}
	pickup := k.pickups[m.ParentID]
	k.mu.Unlock()
	if behind {
		k.m.records.noteActivity()
	}
	cut(slow)
	if raised > 0 {
		k.m.log.Info("kernel output came late after its idle status: waiting longer for it", "kernel", k.id, "late_output_wait", raised)
	}
	if pickup != nil && m.ParentID != "" {
		pickup(m)
	}
}

// deliverLocked gives o to every client, or keeps it for the next client
// while none is connected. It detaches the clients whose queue overflowed
// and returns them: the caller cuts them once it has released k.mu.
func (k *Kernel) deliverLocked(o runs.Outgoing) (slow []*Client) {
	if len(k.clients) == 0 {
		if _, run := k.runs[o.Msg.ParentID]; !run || o.Msg.ParentID == "" {
			k.offline.Push(o)
		}
		return nil
	}
	for c := range k.clients {
		if !c.push(o) {
			delete(k.clients, c)
			slow = append(slow, c)
		}
	}
	return slow
}

// startRun sends the execute_request of a code-interpreter run to jk,
// calling sending with its msg_id just before (an error of it: not sent); ended, called once the
// run has ended, makes the kernel keep its later messages for the next
// client again.
func (k *Kernel) startRun(jk process, content jupyter.ExecuteContent, h jupyter.Handler, sending func(msgID string) error) (c runs.Call, ended func(), err error) {
	m, err := jk.NewMessage(jupyter.ExecuteRequest, content, nil)
	if err != nil {
		return nil, nil, err
	}
	id := m.Header.MsgID
	if err := sending(id); err != nil {
		return nil, nil, err
	}
	k.mu.Lock()
	if k.runs == nil {
		k.runs = map[string]struct{}{}
	}
	k.runs[id] = struct{}{}
	k.mu.Unlock()
	ended = func() {
		k.mu.Lock()
		delete(k.runs, id)
		k.mu.Unlock()
	}
	if c, err = jk.Request(Shell, m, h, jupyter.CallOptions{IOPub: true}); err != nil {
		ended()
		return nil, nil, err
	}
	return c, ended, nil
}

// cut closes the clients that could not keep up (see deliverLocked); the
// caller holds no lock.
func cut(slow []*Client) {
	for _, c := range slow {
		c.closeWith(ErrSlowClient)
	}
}

// orphan takes over the requests of a closed client that still await an
// answer, forgetting the oldest past maxClientCalls.
func (k *Kernel) orphan(calls map[string]*callRef) {
	if len(calls) == 0 {
		return
	}
	k.mu.Lock()
	for _, r := range calls {
		k.orphans = append(k.orphans, r)
	}
	var forget []*callRef
	if over := len(k.orphans) - maxClientCalls; over > 0 {
		forget = append(forget, k.orphans[:over]...)
		k.orphans = append(k.orphans[:0], k.orphans[over:]...)
	}
	k.mu.Unlock()
	for _, r := range forget {
		r.jk.Forget(r.call)
	}
}

// pushStatusLocked tells clients the kernel's state as jupyter_server does
// (an iopub status message without parent). It returns the clients to cut,
// as deliverLocked.
func (k *Kernel) pushStatusLocked(state jupyter.ExecutionState) []*Client {
	m, err := jupyter.NewMessage(k.m.session, jupyter.StatusMsg, map[string]string{"execution_state": string(state)}, nil)
	if err != nil {
		return nil
	}
	return k.deliverLocked(runs.Outgoing{Channel: IOPub, Msg: m})
}

// Attach connects a client (a websocket) to the kernel. It first receives
// what was kept while no client was connected, then the live messages.
func (k *Kernel) Attach(session string) (*Client, error) {
	c := newClient(k, session, k.m.cfg.ClientMessages, k.m.cfg.ClientBytes)
	k.mu.Lock()
	if k.removed {
		k.mu.Unlock()
		return nil, ErrKernelGone
	}
	overflow := false
	if len(k.clients) == 0 {
		for _, o := range k.offline.Take() {
			overflow = !c.push(o) || overflow
		}
	}
	if !overflow {
		k.clients[c] = struct{}{}
	}
	k.mu.Unlock()
	if overflow {
		// The replay did not fit the client's queue: it reads what did,
		// then learns it was cut.
		c.closeWith(ErrSlowClient)
	}
	return c, nil
}

// detach removes a client; what the kernel sends next is kept for the
// next client if it was the last.
func (k *Kernel) detach(c *Client) {
	k.mu.Lock()
	delete(k.clients, c)
	k.lastAct = time.Now()
	behind := k.behindLocked()
	k.mu.Unlock()
	if behind {
		k.m.records.noteActivity()
	}
}

// cullable reports whether the culler should shut the kernel down: idle
// past the timeout (a kernel starting or restarting is not idle), and busy
// or connected only when the policy allows.
func (k *Kernel) cullable(cfg *Config) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ready != nil || (k.jk == nil && k.state != jupyter.StateDead) {
		return false
	}
	return time.Since(k.lastAct) >= cfg.CullIdleTimeout && k.commands == 0 &&
		(cfg.CullBusy || k.state != jupyter.StateBusy) &&
		(cfg.CullConnected || len(k.clients) == 0)
}

package jupyter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"kernelgate/kernelspecs"
)

// Timings of the kernel life cycle.
const (
	// deathGrace is how long a socket EOF waits for the process exit to
	// learn its status before the kernel is declared dead anyway.
	deathGrace = 500 * time.Millisecond
	// nudgeInterval is how long Ready waits for a kernel_info reply or an
	// iopub message before asking again.
	nudgeInterval = 500 * time.Millisecond
	// iopubWait is how long Ready waits for iopub after a reply.
	iopubWait = 100 * time.Millisecond
	// Shutdown escalation: shutdown_request, then SIGTERM, then SIGKILL.
	politeWait = 2 * time.Second
	termWait   = time.Second
	killWait   = 5 * time.Second
	// recentCalls is how many finished requests still receive late iopub
	// messages (a kernel may publish after its idle status).
	recentCalls = 32
	// noReplyWait is how long a request that went idle after an interrupt
	// waits for its reply: a SIGINT that lands before the code runs makes
	// ipykernel drop the reply.
	noReplyWait = 500 * time.Millisecond
	// halfDoneWait is how long a request that has its idle status but no
	// reply (or its reply but no idle status) waits for the other before
	// the kernel is probed with a kernel_info_request: a kernel answers
	// shell requests in order and publishes a request's idle status
	// before it takes the next one, so once the probe is answered what
	// the request still lacks is never coming (ipykernel drops an
	// execute_request whose code holds a NUL; a status can be lost).
	halfDoneWait = time.Second
)

// Config describes a kernel to start.
type Config struct {
	// ID names the kernel; empty means a new UUID.
	ID   string
	Spec *kernelspecs.Spec
	// Env is added to the kernel's environment.
	Env map[string]string
	// DirEnv names directories the gateway made for the kernel; see
	// LaunchRequest.
	DirEnv map[string]string
	// Cwd is the kernel's working directory; see LaunchRequest for
	// StartFresh.
	Cwd        string
	StartFresh bool
	// Kind: see LaunchRequest.
	Kind   string
	Logger *slog.Logger
	// Options are the provisioner's own options (see LaunchRequest).
	Options any
	// IOPub, when set, is subscribed before the kernel is dialled, so it
	// sees every iopub message of the process, those of start-up included.
	IOPub func(*Message)
	// MaxFrame bounds one message the kernel sends, all its frames
	// together (0: DefaultMaxFrame), and MaxFrames their number (0:
	// DefaultMaxFrames). A kernel that sends a larger message other than
	// output is taken for broken and stopped.
	MaxFrame  int64
	MaxFrames int
	// KeepOutput, when set, is what is kept of an output message
	// (stream, display_data, update_display_data, execute_result) larger
	// than it, whatever its size: it is read as it arrives, its signature
	// checked as its bytes pass, and its content cut to a head and a tail
	// with a marker between them (Message.Cut says how many bytes were
	// dropped). The kernel is kept.
	KeepOutput int64
	// KeepResults, when set, is KeepOutput for the output other than
	// stream.
	KeepResults int64
	// HeartbeatTimeout, when set, is how long the kernel may leave a ping
	// on its heartbeat channel unanswered while it has work in flight (a
	// request awaiting its reply or its idle status) before it is taken
	// for dead: it is killed and its calls fail with a DiedError whose
	// Heartbeat is set. The kernel is pinged every HeartbeatPeriod (0:
	// DefaultHeartbeatPeriod) from the first period after its work began
	// until none is left; an idle kernel is never pinged. ipykernel and
	// Deno answer pings from a thread of their own, so a kernel busy with
	// code still answers; one stopped, deadlocked whole or cut off does
	// not.
	HeartbeatTimeout time.Duration
	HeartbeatPeriod  time.Duration
}

// DefaultHeartbeatPeriod is how often a kernel with work in flight is
// pinged when Config.HeartbeatPeriod is not set.
const DefaultHeartbeatPeriod = 5 * time.Second

// Handler receives the messages that answer one request. It is called from
// the socket reader goroutines, possibly concurrently for different
// channels, and must not block.
type Handler func(ch Channel, m *Message)

// CallOptions say what a request waits for.
type CallOptions struct {
	// IOPub routes iopub messages whose parent is the request to the
	// handler, and makes the call complete only once both its reply and its
	// status: idle have arrived, in either order.
	IOPub bool
}

// Call is a request in flight.
type Call struct {
	ID      string
	handler Handler
	opts    CallOptions

	// guarded by the kernel's mu
	reply      *Message
	idle       bool
	finished   bool
	err        error
	interrupts uint64      // the kernel's interrupt count when the call began
	check      *time.Timer // set while it waits for its reply or idle (halfDoneWait)
	probes     []*Call     // the kernel_info_requests sent on its behalf
	probing    bool        // it is such a request
	working    bool        // counted in the kernel's work: neither its reply nor its idle status has come
	seen       bool        // a message answering it has come
	sent       time.Time

	done chan struct{}
}

// Done is closed when the call completed or failed.
func (c *Call) Done() <-chan struct{} { return c.done }

// Result returns the reply, or why there is none. Valid once Done is closed.
func (c *Call) Result() (*Message, error) {
	<-c.done
	return c.reply, c.err
}

// Wait waits for the call to complete. When ctx ends first it returns
// ctx.Err() and the call stays registered: its messages keep flowing.
func (c *Call) Wait(ctx context.Context) (*Message, error) {
	select {
	case <-c.done:
		return c.reply, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// KernelInfo is the kernel_info_reply the kernel gave when it started.
type KernelInfo struct {
	ProtocolVersion       string `json:"protocol_version"`
	Implementation        string `json:"implementation"`
	ImplementationVersion string `json:"implementation_version"`
	LanguageInfo          struct {
		Name          string `json:"name"`
		Version       string `json:"version"`
		MimeType      string `json:"mimetype"`
		FileExtension string `json:"file_extension"`
	} `json:"language_info"`
	Raw json.RawMessage `json:"-"`
}

type subscriber struct{ fn func(*Message) }

// Kernel is one running kernel process and the client connected to it.
// Its life ends when it is shut down or dies; a restart makes a new Kernel.
// Shutdown must be called once it is no longer wanted, even after it died:
// that reaps the process and removes what it left behind.
type Kernel struct {
	cfg     Config
	prov    Provisioner
	caps    Capabilities // of prov for the kernel's spec
	proc    Process
	signer  *Signer
	session string
	log     *slog.Logger
	info    KernelInfo
	started time.Time

	ctx    context.Context // life line of the sockets; only death or shutdown cancels it
	cancel context.CancelFunc
	ch     *channels
	hbReq  chan chan error
	hbTick chan struct{}  // hbTimer fired: time to ping
	pings  atomic.Int64   // heartbeats answered
	wg     sync.WaitGroup // readers, watcher, heartbeat

	mu         sync.Mutex
	interrupts uint64
	pending    map[string]*Call
	recent     [recentCalls]*Call
	recentNext int
	closing    bool
	detached   bool // Detach: the process is left running
	dead       error
	done       chan struct{}
	// work counts the calls that are working; while it is above zero and
	// the heartbeat is watched (hbWatch), hbTimer is armed or a ping is
	// under way. hbTimer is nil when neither.
	work    int
	hbWatch bool
	hbTimer *time.Timer

	subMu sync.Mutex
	subs  atomic.Pointer[[]*subscriber]

	// badSig is closed when a message signed with another key arrived:
	// the kernel is not the one the key names (prove).
	badSig     chan struct{}
	badSigOnce sync.Once

	shutdownOnce sync.Once
}

// Start launches a kernel with p, connects its channels and waits until it
// is ready: a kernel_info reply received and iopub proven live. On failure
// nothing is left running, and the error carries the end of the kernel's
// output; it matches ErrStartFailed. A start that failed is tried again
// while the provisioner says it may be (StartRetrier: a local kernel
// whose ports another process took meanwhile).
func Start(ctx context.Context, p Provisioner, cfg Config) (*Kernel, error) {
	if cfg.ID == "" {
		cfg.ID = uuid.NewString()
	}
	r, _ := p.(StartRetrier)
	for attempt := 1; ; attempt++ {
		k, err := start(ctx, p, cfg)
		if err == nil || r == nil || ctx.Err() != nil || !r.RetryStart(cfg.Spec, err, attempt) {
			return k, err
		}
		if cfg.Logger != nil {
			cfg.Logger.Info("kernel start failed in a way its provisioner retries: starting it again", "kernel", cfg.ID, "err", err)
		}
	}
}

func start(ctx context.Context, p Provisioner, cfg Config) (*Kernel, error) {
	if cfg.ID == "" {
		cfg.ID = uuid.NewString()
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	t0 := time.Now()
	proc, err := p.Launch(ctx, LaunchRequest{KernelID: cfg.ID, Spec: cfg.Spec, Env: cfg.Env, DirEnv: cfg.DirEnv, Cwd: cfg.Cwd, StartFresh: cfg.StartFresh, Options: cfg.Options, Kind: cfg.Kind})
	if err != nil {
		return nil, err
	}
	return attach(ctx, p, proc, cfg, logger, t0)
}

// abandon kills a process that never got a client and cleans up after it.
func abandon(proc Process) {
	proc.Kill()
	select {
	case <-proc.Done():
	case <-time.After(killWait):
	}
	proc.Cleanup()
}

// failStart tears down a kernel that did not become ready and explains why.
func (k *Kernel) failStart(ctx context.Context, cause error) error {
	var died *DiedError
	if !errors.As(cause, &died) && !errors.As(k.Err(), &died) {
		// (The kernel's own death, when it came first, says why: a
		// request that met its sockets closed by die says only that.)
		select {
		case <-k.proc.Done():
			died = &DiedError{Status: k.proc.ExitStatus(), Output: k.proc.Output(), Reason: k.proc.ExitReason()}
		default:
		}
	}
	k.mu.Lock()
	k.closing = true
	k.mu.Unlock()
	k.proc.Kill()
	k.Shutdown(context.Background())
	if died != nil {
		died.During = "start"
		return fmt.Errorf("%w: %w", ErrStartFailed, died)
	}
	if ctx.Err() != nil {
		cause = ErrStartTimeout
	}
	out := k.proc.Output()
	if out != "" {
		return fmt.Errorf("%w: %w: %s", ErrStartFailed, cause, out)
	}
	return fmt.Errorf("%w: %w", ErrStartFailed, cause)
}

// ready sends kernel_info requests until one is answered and an iopub
// message has arrived, so that no early output of the first real request
// can be lost to a subscription not yet in place. It asks on each of
// chans at once and takes the first reply: a kernel that is connected to
// (already running) is asked on the control channel too, which ipykernel
// answers while its shell is busy with code an earlier gateway sent
// (Deno answers on the shell only).
func (k *Kernel) ready(ctx context.Context, chans ...Channel) error {
	iopubSeen := make(chan struct{})
	var once sync.Once
	unsubscribe := k.Subscribe(func(*Message) { once.Do(func() { close(iopubSeen) }) })
	defer unsubscribe()
	for {
		var calls [2]*Call
		var done [2]<-chan struct{} // nil: no call
		forget := func() {
			for _, c := range calls {
				if c != nil {
					k.Forget(c)
				}
			}
		}
		for i, ch := range chans[:min(len(chans), 2)] {
			m, err := k.NewMessage(KernelInfoRequest, nil, nil)
			if err != nil {
				forget()
				return err
			}
			c, err := k.Request(ch, m, nil, CallOptions{})
			if err != nil {
				forget()
				return err
			}
			calls[i], done[i] = c, c.Done()
		}
		var answered *Call
		t := time.NewTimer(nudgeInterval)
		select {
		case <-done[0]:
			answered = calls[0]
		case <-done[1]:
			answered = calls[1]
		case <-t.C:
		case <-k.done:
			t.Stop()
			forget()
			return k.Err()
		case <-ctx.Done():
			t.Stop()
			forget()
			return ctx.Err()
		}
		t.Stop()
		forget()
		if answered == nil {
			continue
		}
		reply, err := answered.Result()
		if err != nil {
			return err
		}
		if err := k.setInfo(reply); err != nil {
			return err
		}
		t = time.NewTimer(iopubWait)
		select {
		case <-iopubSeen:
			t.Stop()
			return nil
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

func (k *Kernel) setInfo(reply *Message) error {
	var info KernelInfo
	if err := reply.DecodeContent(&info); err != nil {
		return err
	}
	info.Raw = reply.RawContent
	k.mu.Lock()
	k.info = info
	k.mu.Unlock()
	return nil
}

// ID is the kernel's id.
func (k *Kernel) ID() string { return k.cfg.ID }

// Spec is the kernelspec it was started from.
func (k *Kernel) Spec() *kernelspecs.Spec { return k.cfg.Spec }

// Config is what the kernel was started with.
func (k *Kernel) Config() Config { return k.cfg }

// PID is the kernel's local process id, or 0.
func (k *Kernel) PID() int { return processID(k.proc) }

// Process is the kernel's process, as its provisioner launched or
// adopted it.
func (k *Kernel) Process() Process { return k.proc }

// Session is the session id of kernelgate's own messages.
func (k *Kernel) Session() string { return k.session }

// Started is when the kernel was launched.
func (k *Kernel) Started() time.Time { return k.started }

// Info is the kernel_info_reply received when the kernel started.
func (k *Kernel) Info() KernelInfo {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.info
}

// Done is closed when the kernel died or was shut down.
func (k *Kernel) Done() <-chan struct{} { return k.done }

// Err says why Done was closed: a *DiedError, ErrKernelShutdown, or nil
// while the kernel is alive.
func (k *Kernel) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.dead
}

// Output is the tail of the kernel's stdout and stderr.
func (k *Kernel) Output() string { return k.proc.Output() }

// NewMessage builds a message in the kernel client's session.
func (k *Kernel) NewMessage(t MsgType, content any, parent *Message) (*Message, error) {
	return NewMessage(k.session, t, content, parent)
}

// Subscribe calls fn with every iopub message, in order, from the iopub
// reader goroutine; fn must not block. The returned func unsubscribes.
func (k *Kernel) Subscribe(fn func(*Message)) (unsubscribe func()) {
	s := &subscriber{fn: fn}
	k.subMu.Lock()
	old := *k.subs.Load()
	next := make([]*subscriber, len(old), len(old)+1)
	copy(next, old)
	next = append(next, s)
	k.subs.Store(&next)
	k.subMu.Unlock()
	return func() {
		k.subMu.Lock()
		defer k.subMu.Unlock()
		old := *k.subs.Load()
		next := make([]*subscriber, 0, len(old))
		for _, o := range old {
			if o != s {
				next = append(next, o)
			}
		}
		k.subs.Store(&next)
	}
}

// Send signs m and sends it on ch without waiting for anything.
func (k *Kernel) Send(ch Channel, m *Message) error {
	if err := k.Err(); err != nil {
		return err
	}
	s := k.ch.socket(ch)
	if s == nil || ch == IOPub || ch == Heartbeat {
		return fmt.Errorf("%w: %s", ErrChannelUnsupported, ch)
	}
	return s.send(Encode(m, k.signer))
}

// Request sends m on ch (shell or control) and routes the messages that
// answer it to h (which may be nil). See CallOptions for when it completes.
func (k *Kernel) Request(ch Channel, m *Message, h Handler, opts CallOptions) (*Call, error) {
	if ch != Shell && ch != Control {
		return nil, fmt.Errorf("%w: %s", ErrChannelUnsupported, ch)
	}
	c := &Call{ID: m.Header.MsgID, handler: h, opts: opts, done: make(chan struct{})}
	k.mu.Lock()
	if k.dead != nil {
		err := k.dead
		k.mu.Unlock()
		return nil, err
	}
	if _, dup := k.pending[c.ID]; dup {
		k.mu.Unlock()
		return nil, fmt.Errorf("%w: msg_id %s is already awaiting a reply", ErrDuplicateRequest, c.ID)
	}
	c.interrupts = k.interrupts
	c.sent = time.Now()
	k.pending[c.ID] = c
	k.beginWorkLocked(c)
	k.mu.Unlock()
	if err := k.Send(ch, m); err != nil {
		k.Forget(c)
		return nil, err
	}
	return c, nil
}

// Forget stops routing messages to c; its Done stays open unless it was
// already closed.
func (k *Kernel) Forget(c *Call) {
	k.mu.Lock()
	if k.pending[c.ID] == c {
		delete(k.pending, c.ID)
	}
	k.endWorkLocked(c)
	k.mu.Unlock()
}

// ExecuteContent is the content of an execute_request.
type ExecuteContent struct {
	Code            string            `json:"code"`
	Silent          bool              `json:"silent"`
	StoreHistory    bool              `json:"store_history"`
	UserExpressions map[string]string `json:"user_expressions"`
	AllowStdin      bool              `json:"allow_stdin"`
	StopOnError     bool              `json:"stop_on_error"`
}

// NewExecute returns the content of an ordinary execute_request of code.
func NewExecute(code string) ExecuteContent {
	return ExecuteContent{Code: code, StoreHistory: true, StopOnError: true, UserExpressions: map[string]string{}}
}

// StartExecute sends an execute_request; the call completes once both its
// reply and its status: idle have arrived.
func (k *Kernel) StartExecute(content ExecuteContent, h Handler) (*Call, error) {
	m, err := k.NewMessage(ExecuteRequest, content, nil)
	if err != nil {
		return nil, err
	}
	return k.Request(Shell, m, h, CallOptions{IOPub: true})
}

// Execute runs code and returns its execute_reply; every iopub and stdin
// message it causes goes to h.
func (k *Kernel) Execute(ctx context.Context, code string, h Handler) (*Message, error) {
	c, err := k.StartExecute(NewExecute(code), h)
	if err != nil {
		return nil, err
	}
	reply, err := c.Wait(ctx)
	if err != nil {
		k.Forget(c)
	}
	return reply, err
}

// Interrupt interrupts what the kernel is running: SIGINT to its process
// group, or an interrupt_request on control when its spec says
// interrupt_mode "message", its provisioner cannot signal it (a pod) or
// its process must not be signalled (a sandbox).
func (k *Kernel) Interrupt(ctx context.Context) error {
	if err := k.Err(); err != nil {
		return err
	}
	k.mu.Lock()
	k.interrupts++
	k.mu.Unlock()
	if k.cfg.Spec.InterruptMode != kernelspecs.InterruptMessage && k.caps.SignalInterrupts {
		if err := k.proc.Interrupt(); !errors.Is(err, ErrInterruptByMessage) {
			return err
		}
	}
	m, err := k.NewMessage(InterruptRequest, nil, nil)
	if err != nil {
		return err
	}
	c, err := k.Request(Control, m, nil, CallOptions{})
	if err != nil {
		return err
	}
	if _, err := c.Wait(ctx); err != nil {
		k.Forget(c)
		if errors.Is(err, context.DeadlineExceeded) {
			return ErrInterruptTimeout
		}
		return err
	}
	return nil
}

// Ping sends a heartbeat and waits for its echo. With a HeartbeatTimeout,
// an echo that does not come within it kills the kernel, as a ping of
// its own does.
func (k *Kernel) Ping(ctx context.Context) error {
	r := make(chan error, 1)
	select {
	case k.hbReq <- r:
	case <-k.done:
		return k.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-r:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// heartbeat owns the REQ socket: one ping at a time, on demand (Ping) or
// every heartbeat period while the kernel has work in flight (hbTimer).
// It wakes for nothing else: an idle kernel costs the gateway no CPU.
func (k *Kernel) heartbeat() {
	defer k.wg.Done()
	for {
		select {
		case r := <-k.hbReq:
			err := k.ping()
			r <- err
			if err != nil {
				k.heartbeatLost(err)
				return
			}
		case <-k.hbTick:
			k.mu.Lock()
			idle := k.work == 0 || k.dead != nil
			if idle {
				k.hbTimer = nil
			}
			k.mu.Unlock()
			if idle {
				continue
			}
			if err := k.ping(); err != nil {
				k.heartbeatLost(err)
				return
			}
			k.mu.Lock()
			k.ignoredLocked()
			if k.work == 0 || k.dead != nil {
				k.hbTimer = nil
			} else {
				k.hbTimer.Reset(k.heartbeatPeriod())
			}
			k.mu.Unlock()
		case <-k.ctx.Done():
			return
		}
	}
}

// ping sends one heartbeat and waits for its echo, at most
// HeartbeatTimeout when set. The read deadline is cleared after: an armed
// one would wake the idle gateway when it expires.
func (k *Kernel) ping() error {
	s := k.ch.hb
	if d := k.cfg.HeartbeatTimeout; d > 0 {
		s.raw.SetReadDeadline(time.Now().Add(d))
		defer s.raw.SetReadDeadline(time.Time{})
	}
	if err := s.send([][]byte{[]byte("ping")}); err != nil {
		return err
	}
	if _, err := s.recv(); err != nil {
		return err
	}
	k.pings.Add(1)
	return nil
}

// heartbeatLost ends the kernel whose heartbeat failed: one that did not
// answer in time is killed; a closed connection is lost as any other.
func (k *Kernel) heartbeatLost(err error) {
	if k.ctx.Err() != nil {
		return
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		k.lost(Heartbeat, err)
		return
	}
	d := k.cfg.HeartbeatTimeout
	k.log.Warn("the kernel did not answer its heartbeat: stopping it", "timeout", d)
	k.die(&DiedError{Status: "stopped by kernelgate", Heartbeat: d, Output: k.proc.Output(),
		Reason: fmt.Sprintf("its heartbeat stopped: no answer within %v while it had work in flight", d)})
}

func (k *Kernel) heartbeatPeriod() time.Duration {
	if k.cfg.HeartbeatPeriod > 0 {
		return k.cfg.HeartbeatPeriod
	}
	return DefaultHeartbeatPeriod
}

// beginWorkLocked counts c, just sent, as work in flight, and arms the
// heartbeat's timer if it is the only one; the caller holds k.mu.
func (k *Kernel) beginWorkLocked(c *Call) {
	c.working = true
	k.work++
	k.armHeartbeatLocked()
}

// endWorkLocked stops counting c as work in flight: the kernel answered
// it, or it is no longer waited for. The heartbeat's timer stays armed:
// when it fires with no work, the heartbeat goes quiet.
func (k *Kernel) endWorkLocked(c *Call) {
	if c.working {
		c.working = false
		k.work--
	}
}

// ignoredLocked stops counting as work the requests that the kernel,
// alive as its heartbeat just showed, has left without a sign for
// HeartbeatTimeout: it ignores them (Deno does so with control requests
// it does not know), and pinging it for them would never end. A request
// queued behind a running one is covered by that one.
func (k *Kernel) ignoredLocked() {
	for _, c := range k.pending {
		if c.working && !c.seen && time.Since(c.sent) >= k.cfg.HeartbeatTimeout {
			k.endWorkLocked(c)
		}
	}
}

// armHeartbeatLocked arms the heartbeat's timer when the kernel has work
// in flight, its heartbeat is watched and the timer is idle.
func (k *Kernel) armHeartbeatLocked() {
	if k.work == 0 || !k.hbWatch || k.hbTimer != nil || k.dead != nil {
		return
	}
	k.hbTimer = time.AfterFunc(k.heartbeatPeriod(), func() {
		select {
		case k.hbTick <- struct{}{}:
		default:
		}
	})
}

// watchHeartbeat starts watching the heartbeat of a kernel that became
// ready, when a HeartbeatTimeout is set: a start or a connection has
// deadlines of its own.
func (k *Kernel) watchHeartbeat() {
	if k.cfg.HeartbeatTimeout <= 0 {
		return
	}
	k.mu.Lock()
	k.hbWatch = true
	k.armHeartbeatLocked()
	k.mu.Unlock()
}

// Shutdown stops the kernel: shutdown_request on control, then SIGTERM,
// then SIGKILL of its process group, each after a bounded wait (at once
// when ctx ends). It waits for the process to be reaped and every
// goroutine of the kernel to end, then cleans up. It is idempotent and
// safe after the kernel died.
func (k *Kernel) Shutdown(ctx context.Context) error {
	k.shutdownOnce.Do(func() {
		k.mu.Lock()
		k.closing = true
		alive := k.dead == nil && k.ch != nil
		k.mu.Unlock()
		if alive {
			if m, err := k.NewMessage(ShutdownRequest, map[string]bool{"restart": false}, nil); err == nil {
				k.Send(Control, m)
			}
		}
		k.escalate(ctx)
		k.die(ErrKernelShutdown)
		k.wg.Wait()
		if err := k.proc.Cleanup(); err != nil {
			k.log.Warn("kernel cleanup", "err", err)
		}
	})
	return nil
}

// escalate waits for the process to exit, signalling harder each time.
// Once ctx ends it sends SIGTERM and SIGKILL at once; the wait after
// SIGKILL is bounded by killWait whatever ctx says, so it always returns.
func (k *Kernel) escalate(ctx context.Context) {
	if k.exited(politeWait, ctx.Done()) {
		return
	}
	k.proc.Terminate()
	if ctx.Err() == nil && k.exited(termWait, ctx.Done()) {
		return
	}
	k.proc.Kill()
	if k.exited(killWait, nil) {
		return
	}
	k.log.Warn("kernel process did not exit after SIGKILL", "pid", processID(k.proc))
}

// exited waits up to d for the process to exit, or until hurry is
// closed, and reports whether it exited.
func (k *Kernel) exited(d time.Duration, hurry <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-k.proc.Done():
		return true
	case <-t.C:
	case <-hurry:
	}
	select {
	case <-k.proc.Done():
		return true
	default:
		return false
	}
}

// Restart shuts the kernel down and starts a new one with the same
// configuration: a new process with new sockets.
func (k *Kernel) Restart(ctx context.Context) (*Kernel, error) {
	k.Shutdown(ctx)
	return Start(ctx, k.prov, k.cfg)
}

// read is the one goroutine reading socket s.
func (k *Kernel) read(ch Channel, s *socket) {
	defer k.wg.Done()
	for {
		frames, cut, err := s.recvCut()
		if err != nil {
			k.lost(ch, err)
			return
		}
		var m *Message
		if cut != nil {
			m, err = decodeCut(frames, cut)
		} else {
			m, err = Decode(frames, k.signer)
		}
		if err != nil {
			k.log.Warn("dropped a message from the kernel", "channel", ch.String(), "err", err)
			if errors.Is(err, ErrInvalidSignature) {
				k.badSigOnce.Do(func() { close(k.badSig) })
			}
			continue
		}
		k.dispatch(ch, m)
		if m.Size() >= yieldAfter {
			// Let the goroutines the message woke (the write pumps of
			// the websockets it goes to) send it before the next read:
			// on a gateway with one P, a reader with more output
			// waiting would otherwise read on and pile it up in memory
			// (tens of MiB of 1 MiB prints), which the runtime then
			// hands back to the system and faults in again.
			runtime.Gosched()
		}
	}
}

// yieldAfter is the size of a message after which its reader yields.
const yieldAfter = 64 << 10

// dispatch hands m to the iopub subscribers and to the call it answers.
func (k *Kernel) dispatch(ch Channel, m *Message) {
	if ch == IOPub {
		for _, s := range *k.subs.Load() {
			s.fn(m)
		}
	}
	if m.ParentID == "" {
		return
	}
	k.mu.Lock()
	c := k.pending[m.ParentID]
	if c == nil {
		c = k.findRecent(m.ParentID)
	}
	if c != nil {
		c.seen = true
		if c.working && ((ch == IOPub && m.Header.MsgType == StatusMsg && isIdle(m)) || (ch != IOPub && m.Header.MsgType.IsReply())) {
			k.endWorkLocked(c)
		}
	}
	if c == nil || (ch == IOPub && !c.opts.IOPub) {
		k.mu.Unlock()
		return
	}
	h := c.handler
	k.mu.Unlock()
	// The handler runs before the message counts towards the call's end:
	// the reply and the idle status come from two readers, and whichever
	// comes second ends the call, which must not happen before the other
	// one's handler has returned.
	if h != nil {
		h(ch, m)
	}
	k.mu.Lock()
	finish := false
	// Still pending: not finished by another reader, failed by the
	// kernel's death or forgotten meanwhile.
	if k.pending[c.ID] == c {
		switch {
		case ch == IOPub && m.Header.MsgType == StatusMsg:
			idle := isIdle(m)
			if idle && !c.idle && c.reply == nil && k.interrupts > c.interrupts {
				time.AfterFunc(noReplyWait, func() { k.replyLost(c) })
			} else if idle && !c.idle && c.reply == nil && c.check == nil && !c.probing {
				c.check = time.AfterFunc(halfDoneWait, func() { k.probeFor(c) })
			}
			c.idle = c.idle || idle
		case (ch == Shell || ch == Control) && m.Header.MsgType.IsReply():
			c.reply = m
			if c.opts.IOPub && !c.idle && c.check == nil && !c.probing {
				c.check = time.AfterFunc(halfDoneWait, func() { k.probeFor(c) })
			}
		}
		if c.reply != nil && (c.idle || !c.opts.IOPub) {
			finish = true
			k.finishLocked(c, nil)
		}
	}
	k.mu.Unlock()
	if finish {
		close(c.done)
	}
}

// finishLocked ends c with err (nil: it has its reply and idle status);
// the caller holds k.mu and closes c.done after releasing it.
func (k *Kernel) finishLocked(c *Call, err error) {
	c.err, c.finished = err, true
	delete(k.pending, c.ID)
	k.endWorkLocked(c)
	if c.check != nil {
		c.check.Stop()
	}
	for _, p := range c.probes {
		if k.pending[p.ID] == p {
			delete(k.pending, p.ID)
		}
	}
	if c.opts.IOPub && !c.probing {
		k.recent[k.recentNext] = c
		k.recentNext = (k.recentNext + 1) % recentCalls
	}
}

// probeFor sends a kernel_info_request on behalf of c, which has had its
// idle status without a reply, or its reply without an idle status, for
// halfDoneWait. What the kernel does for the probe after c tells whether
// the rest of c is still coming: its reply comes after c's reply, its
// idle status after c's idle status. A request the kernel dropped fails
// with ErrRequestDropped; one whose idle status was lost ends with its
// reply. The kernel and its state are kept. A probe answered on shell
// whose idle status has not come either (a kernel flooding its iopub
// socket past the high-water mark drops statuses with its output) is
// followed by another, later and later, until one's idle status comes.
func (k *Kernel) probeFor(c *Call) {
	k.mu.Lock()
	if k.pending[c.ID] != c {
		k.mu.Unlock()
		return
	}
	k.mu.Unlock()
	m, err := k.NewMessage(KernelInfoRequest, nil, nil)
	if err != nil {
		return
	}
	probe := &Call{ID: m.Header.MsgID, opts: CallOptions{IOPub: true}, probing: true, done: make(chan struct{})}
	probe.handler = func(ch Channel, pm *Message) { k.probed(c, probe, ch, pm) }
	k.mu.Lock()
	if k.dead != nil || k.pending[c.ID] != c {
		k.mu.Unlock()
		return
	}
	c.probes = append(c.probes, probe)
	probe.interrupts = k.interrupts
	k.pending[probe.ID] = probe
	k.mu.Unlock()
	if err := k.Send(Shell, m); err != nil {
		k.Forget(probe)
	}
}

// probed handles what answers probe, sent on behalf of c.
func (k *Kernel) probed(c, probe *Call, ch Channel, m *Message) {
	answered := (ch == Shell && m.Header.MsgType.IsReply()) || (ch == IOPub && m.Header.MsgType == StatusMsg && isIdle(m))
	if !answered {
		return
	}
	k.mu.Lock()
	if k.pending[c.ID] != c {
		k.mu.Unlock()
		return
	}
	dropped := false
	switch {
	case c.reply != nil && !c.idle && ch == Shell:
		// Answered, but neither c's idle status nor the probe's has come:
		// probe again unless a later probe is out already.
		if n := len(c.probes); c.probes[n-1] == probe {
			c.check = time.AfterFunc(time.Duration(n)*halfDoneWait, func() { k.probeFor(c) })
		}
		k.mu.Unlock()
		return
	case c.reply == nil && ch == Shell:
		dropped = true
		k.finishLocked(c, fmt.Errorf("%w (request %s): it answered a kernel_info_request sent %v after", ErrRequestDropped, c.ID, halfDoneWait))
	case c.reply != nil && !c.idle && ch == IOPub:
		c.idle = true
		k.finishLocked(c, nil)
	default:
		k.mu.Unlock()
		return
	}
	k.mu.Unlock()
	close(c.done)
	if dropped {
		k.log.Warn("the kernel went idle without answering a request; the request fails, the kernel keeps running", "msg_id", c.ID)
	} else {
		k.log.Info("a request's idle status never came; it ends with its reply", "msg_id", c.ID)
	}
}

// replyLost finishes a call that went idle after an interrupt without a
// reply, with a reply made up as the kernel would have sent it.
func (k *Kernel) replyLost(c *Call) {
	m, err := k.NewMessage(ExecuteReply, map[string]any{
		"status": "error", "ename": "KeyboardInterrupt", "evalue": "interrupted before the code ran", "traceback": []string{},
	}, nil)
	if err != nil {
		return
	}
	m.ParentID = c.ID
	m.RawParent, _ = json.Marshal(parentRef{MsgID: c.ID, MsgType: ExecuteRequest})
	k.mu.Lock()
	if c.finished || k.pending[c.ID] != c {
		k.mu.Unlock()
		return
	}
	k.mu.Unlock()
	k.log.Info("the kernel went idle after an interrupt without replying; the request ends interrupted")
	k.dispatch(Shell, m)
}

func (k *Kernel) findRecent(id string) *Call {
	for _, c := range k.recent {
		if c != nil && c.ID == id {
			return c
		}
	}
	return nil
}

func isIdle(m *Message) bool { return m.ExecutionState() == StateIdle }

// watch ends the kernel when its process ends.
func (k *Kernel) watch() {
	defer k.wg.Done()
	select {
	case <-k.proc.Done():
		k.die(k.diedError())
	case <-k.ctx.Done():
	}
}

// lost is called when a socket reader stops.
func (k *Kernel) lost(ch Channel, err error) {
	if k.ctx.Err() != nil {
		return
	}
	k.log.Debug("kernel socket closed", "channel", ch.String(), "err", err)
	if errors.Is(err, ErrMessageTooLarge) {
		k.log.Warn("stopping a kernel that sent a message over the limit", "err", err)
		k.die(&DiedError{Status: "stopped by kernelgate", Reason: err.Error(), Output: k.proc.Output()})
		return
	}
	t := time.NewTimer(deathGrace)
	defer t.Stop()
	select {
	case <-t.C:
		// The process runs on without this connection: the peer was
		// most likely not the kernel (during a start, another process
		// that had the port and closed it), so the kernel is of no use.
		k.die(&DiedError{Output: k.proc.Output(), Lost: ch.String()})
		return
	case <-k.proc.Done():
	case <-k.ctx.Done():
	}
	k.die(k.diedError())
}

func (k *Kernel) diedError() error {
	return &DiedError{Status: k.proc.ExitStatus(), Output: k.proc.Output(), Reason: k.proc.ExitReason()}
}

// die records why the kernel ended, fails every pending call, closes the
// sockets and makes sure the process is gone. Only the first call counts.
func (k *Kernel) die(err error) {
	k.mu.Lock()
	if k.dead != nil {
		k.mu.Unlock()
		return
	}
	if k.closing && !k.detached {
		err = ErrKernelShutdown
	}
	detached := k.detached
	k.dead = err
	calls := k.pending
	k.pending = nil
	for _, c := range calls {
		c.err, c.finished, c.working = err, true, false
	}
	k.work = 0
	if k.hbTimer != nil {
		k.hbTimer.Stop()
	}
	k.mu.Unlock()
	for _, c := range calls {
		close(c.done)
	}
	close(k.done)
	k.cancel()
	if k.ch != nil {
		k.ch.close()
	}
	if detached {
		return
	}
	select {
	case <-k.proc.Done():
	default:
		k.proc.Kill()
	}
}

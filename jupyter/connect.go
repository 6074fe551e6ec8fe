package jupyter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
)

// ErrConnectFailed: a running kernel did not answer a new client. The
// kernel is left as it was.
var ErrConnectFailed = errors.New("jupyter: could not connect to the running kernel")

// ErrWrongKey: the running kernel signs its messages with another key
// than the one it was recorded with. It is not adopted.
var ErrWrongKey = errors.New("jupyter: the kernel signs with another key")

// Connect makes a client of a kernel that is already running, from its
// Process (one a provisioner adopted: Adopter.Adopt) without launching
// anything: jupyter_client's connect and load_connection_info. It dials
// the channels of proc.ConnInfo and waits until the kernel proves itself:
// a kernel_info reply signed with the connection's key, and iopub live
// (see prove). A reply signed otherwise is dropped, so a kernel with
// another key never answers; a message signed with another key fails it
// at once (ErrWrongKey). ctx bounds the wait. On failure the process is
// left running and released: whether to stop it is the caller's choice.
// p is what a Restart launches with; cfg.Spec must be the kernel's
// kernelspec.
func Connect(ctx context.Context, p Provisioner, proc Process, cfg Config) (*Kernel, error) {
	c, err := beginConnect(ctx, p, proc, cfg)
	if err != nil {
		return nil, err
	}
	return c.Result()
}

// Reconnect adopts the kernel info names with p and connects to it: what
// a gateway does for each kernel of its store when it starts again. A
// kernel that is not the same live process fails with ErrNotAdoptable
// and nothing is touched.
func Reconnect(ctx context.Context, p Provisioner, info ProvisionerInfo, cfg Config) (*Kernel, error) {
	c, err := BeginReconnect(ctx, p, info, cfg)
	if err != nil {
		return nil, err
	}
	return c.Result()
}

// BeginReconnect is Reconnect that returns once the kernel is found to be
// the same live process and its channels are dialled; the kernel proves
// itself in the background (Connecting), as long as ctx lasts: a kernel
// busy with a long request may answer only once it is done. Cancel ctx to
// give up; the process is then left running, as on any failure.
func BeginReconnect(ctx context.Context, p Provisioner, info ProvisionerInfo, cfg Config) (*Connecting, error) {
	a, ok := p.(Adopter)
	if !ok {
		return nil, fmt.Errorf("%w: its provisioner cannot adopt kernels", ErrNotAdoptable)
	}
	proc, err := a.Adopt(ctx, info)
	if err != nil {
		return nil, err
	}
	return beginConnect(ctx, p, proc, cfg)
}

// Connecting is a client of a running kernel that has not proven itself
// yet (BeginReconnect). Its goroutine ends when the kernel has proven
// itself, failed to, died, or ctx ended.
type Connecting struct {
	k    *Kernel
	done chan struct{}
	err  error // set before done is closed
}

func beginConnect(ctx context.Context, p Provisioner, proc Process, cfg Config) (*Connecting, error) {
	if cfg.Spec == nil {
		release(proc)
		return nil, fmt.Errorf("%w: no kernelspec", ErrConnectFailed)
	}
	if cfg.ID == "" {
		cfg.ID = uuid.NewString()
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	t0 := time.Now()
	k, err := dial(ctx, p, proc, cfg, logger, t0, true)
	if err != nil {
		return nil, err
	}
	c := &Connecting{k: k, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		if err := k.prove(ctx); err != nil {
			c.err = k.failConnect(ctx, err)
			return
		}
		k.watchHeartbeat()
		k.log.Debug("kernel connected", "spec", cfg.Spec.Name, "pid", processID(proc), "took", time.Since(t0))
	}()
	return c, nil
}

// Done is closed once the kernel has proven itself or failed to.
func (c *Connecting) Done() <-chan struct{} { return c.done }

// Result waits for Done and returns the connected kernel, or why it could
// not be connected (the process is then left running).
func (c *Connecting) Result() (*Kernel, error) {
	<-c.done
	if c.err != nil {
		return nil, c.err
	}
	return c.k, nil
}

// PID is the kernel's process id.
func (c *Connecting) PID() int { return processID(c.k.proc) }

// Interrupt interrupts the kernel while it proves itself, as
// Kernel.Interrupt does (a signal, or an interrupt_request whose reply
// counts only when signed with the key).
func (c *Connecting) Interrupt(ctx context.Context) error { return c.k.Interrupt(ctx) }

// attach makes the client of a process just launched: it dials, starts
// the readers and waits until the kernel is ready. A start that fails
// kills proc.
func attach(ctx context.Context, p Provisioner, proc Process, cfg Config, logger *slog.Logger, t0 time.Time) (*Kernel, error) {
	k, err := dial(ctx, p, proc, cfg, logger, t0, false)
	if err != nil {
		return nil, err
	}
	if err := k.ready(ctx, Shell); err != nil {
		return nil, k.failStart(ctx, err)
	}
	k.watchHeartbeat()
	k.log.Debug("kernel ready", "spec", cfg.Spec.Name, "pid", processID(proc), "took", time.Since(t0))
	return k, nil
}

// dial makes the client of proc: it dials its channels and starts the
// readers. On failure a launched process (connecting false) is killed, a
// running one (connecting) left running.
func dial(ctx context.Context, p Provisioner, proc Process, cfg Config, logger *slog.Logger, t0 time.Time, connecting bool) (*Kernel, error) {
	ci := proc.ConnInfo()
	signer, err := NewSigner(ci.SignatureScheme, []byte(ci.Key), 0)
	if err != nil {
		if connecting {
			release(proc)
			return nil, fmt.Errorf("%w: %w", ErrConnectFailed, err)
		}
		abandon(proc)
		return nil, fmt.Errorf("%w: %w", ErrStartFailed, err)
	}
	k := &Kernel{
		cfg: cfg, prov: p, caps: p.Capabilities(cfg.Spec), proc: proc, signer: signer,
		session: uuid.NewString(),
		log:     logger.With("kernel", cfg.ID),
		started: t0,
		hbReq:   make(chan chan error),
		hbTick:  make(chan struct{}, 1),
		pending: make(map[string]*Call),
		done:    make(chan struct{}),
		badSig:  make(chan struct{}),
	}
	fail := k.failStart
	if connecting {
		fail = k.failConnect
	}
	k.subs.Store(&[]*subscriber{})
	if cfg.IOPub != nil {
		k.Subscribe(cfg.IOPub)
	}
	k.ctx, k.cancel = context.WithCancel(context.Background())

	// The dial retries until the kernel binds; give up when the process
	// dies or ctx ends.
	dialing := make(chan struct{})
	go func() {
		select {
		case <-proc.Done():
			k.cancel()
		case <-ctx.Done():
			k.cancel()
		case <-dialing:
		}
	}()
	k.ch, err = dialChannels(k.ctx, &ci, k.session, readLimits{
		message: uint64(max(cfg.MaxFrame, 0)), frames: cfg.MaxFrames, keep: uint64(max(cfg.KeepOutput, 0)), keepResults: uint64(max(cfg.KeepResults, 0)), signer: signer})
	close(dialing)
	if err != nil {
		return nil, fail(ctx, err)
	}
	for _, c := range []Channel{Shell, Control, Stdin, IOPub} {
		k.wg.Add(1)
		go k.read(c, k.ch.socket(c))
	}
	k.wg.Add(2)
	go k.watch()
	go k.heartbeat()
	return k, nil
}

// Proving a running kernel (prove).
const (
	// busyWait is how long a kernel that answered kernel_info with its
	// key may publish nothing on iopub before it is taken as busy: its
	// shell runs a request, and Deno publishes nothing for control
	// requests.
	busyWait = 500 * time.Millisecond
	// maxNudge bounds the interval between the requests sent to a kernel
	// that does not answer.
	maxNudge = 10 * time.Second
)

// prove waits until a running kernel answers a kernel_info_request signed
// with the connection's key and iopub is proven live, as ready does for a
// kernel just launched. The request goes on control, which ipykernel and
// Deno answer while their shell is busy, and on shell, one at a time, so
// that a busy kernel's shell queue does not fill up with them. Control is
// asked again ever more rarely while nothing answers; after an answer,
// every iopubWait, until iopub shows a message. A kernel that answered but
// publishes nothing for busyWait is busy: a request on its shell holds it,
// and the shell request, answered later, makes it publish. A message
// signed with another key fails it at once (ErrWrongKey).
func (k *Kernel) prove(ctx context.Context) error {
	iopubSeen := make(chan struct{})
	var once sync.Once
	unsubscribe := k.Subscribe(func(*Message) { once.Do(func() { close(iopubSeen) }) })
	defer unsubscribe()
	var shell, control *Call
	defer func() {
		for _, c := range []*Call{shell, control} {
			if c != nil {
				k.Forget(c)
			}
		}
	}()
	send := func(ch Channel) (*Call, error) {
		m, err := k.NewMessage(KernelInfoRequest, nil, nil)
		if err != nil {
			return nil, err
		}
		return k.Request(ch, m, nil, CallOptions{})
	}
	var err error
	if shell, err = send(Shell); err != nil {
		return err
	}
	if control, err = send(Control); err != nil {
		return err
	}
	done := func(c *Call) <-chan struct{} {
		if c == nil {
			return nil
		}
		return c.Done()
	}
	answered, iopub := false, false
	nudge := nudgeInterval
	t := time.NewTimer(nudge)
	defer t.Stop()
	var busy <-chan time.Time
	for {
		var reply *Call
		select {
		case <-done(shell):
			reply, shell = shell, nil
		case <-done(control):
			reply, control = control, nil
		case <-iopubSeen:
			iopubSeen, iopub = nil, true
			if answered {
				return nil
			}
			continue
		case <-busy:
			return nil
		case <-t.C:
			// Ask again: on control always, on shell once the last one
			// is answered.
			if control != nil {
				k.Forget(control)
			}
			if control, err = send(Control); err != nil {
				return err
			}
			if shell == nil {
				if shell, err = send(Shell); err != nil {
					return err
				}
			}
			if answered {
				t.Reset(iopubWait)
			} else {
				nudge = min(2*nudge, maxNudge)
				t.Reset(nudge)
			}
			continue
		case <-k.badSig:
			return ErrWrongKey
		case <-k.done:
			return k.Err()
		case <-ctx.Done():
			return ctx.Err()
		}
		m, err := reply.Result()
		if err != nil {
			return err
		}
		if !answered {
			if err := k.setInfo(m); err != nil {
				return err
			}
			answered = true
			if iopub {
				return nil
			}
			bt := time.NewTimer(busyWait)
			defer bt.Stop()
			busy = bt.C
			t.Reset(iopubWait)
		}
	}
}

// failConnect closes a client that could not connect, leaving the
// process as it is.
func (k *Kernel) failConnect(ctx context.Context, cause error) error {
	select {
	case <-k.proc.Done():
		k.Shutdown(context.Background())
		return fmt.Errorf("%w: %w", ErrConnectFailed, k.diedError())
	default:
	}
	k.Detach()
	if ctx.Err() != nil && !errors.Is(cause, ErrWrongKey) {
		return fmt.Errorf("%w: no signed kernel_info reply in time: %w", ErrConnectFailed, ctx.Err())
	}
	return fmt.Errorf("%w: %w", ErrConnectFailed, cause)
}

// Detach closes the client and leaves the kernel process running, for
// this or a later gateway to connect to again (Reconnect). Pending calls
// fail with ErrKernelDetached, and the Kernel is done; a Shutdown after
// it does nothing. A process the provisioner watches without being its
// parent (an adopted one) is released; a child process stays watched by
// its wait goroutine until it ends.
func (k *Kernel) Detach() {
	k.shutdownOnce.Do(func() {
		k.mu.Lock()
		k.detached = true
		k.mu.Unlock()
		k.die(ErrKernelDetached)
		k.wg.Wait()
		release(k.proc)
	})
}

func release(proc Process) {
	if r, ok := proc.(Releaser); ok {
		r.Release()
	}
}

// Stop ends the kernel info names without a client: what a gateway does
// with a kept kernel it cannot or will not connect to (one whose key no
// longer answers, a warm-pool kernel of an earlier gateway). The
// provisioner adopts it, which it does only while the kernel is the one
// info names, then terminates it and kills it after grace, and cleans up
// after it. A kernel already gone is no error: what it left behind is
// removed when its provisioner can tell (LeftoverRemover).
func Stop(ctx context.Context, p Provisioner, info ProvisionerInfo, grace time.Duration) error {
	a, ok := p.(Adopter)
	if !ok {
		return fmt.Errorf("%w: its provisioner cannot adopt kernels", ErrNotAdoptable)
	}
	proc, err := a.Adopt(ctx, info)
	if err != nil {
		if r, ok := p.(LeftoverRemover); ok && errors.Is(err, ErrNotAdoptable) && r.RemoveLeftovers(info) {
			return nil
		}
		return err
	}
	proc.Terminate()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-proc.Done():
		return proc.Cleanup()
	case <-t.C:
	case <-ctx.Done(): // no more grace
	}
	proc.Kill()
	t.Reset(killWait)
	select {
	case <-proc.Done():
	case <-t.C:
		release(proc)
		return fmt.Errorf("jupyter: kernel process %d did not exit after SIGKILL", processID(proc))
	}
	return proc.Cleanup()
}

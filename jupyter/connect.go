package jupyter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/google/uuid"
)

// ErrConnectFailed: a running kernel did not answer a new client. The
// kernel is left as it was.
var ErrConnectFailed = errors.New("jupyter: could not connect to the running kernel")

// Connect makes a client of a kernel that is already running, from its
// Process (one a provisioner adopted: Adopter.Adopt) without launching
// anything: jupyter_client's connect and load_connection_info. It dials
// the channels of proc.ConnInfo, proves iopub live and waits for a
// kernel_info reply signed with the connection's key (a reply signed
// otherwise is dropped, so a kernel with another key never answers). ctx
// bounds the wait. On failure the process is left running and released:
// whether to stop it is the caller's choice. p is what a Restart launches
// with; cfg.Spec must be the kernel's kernelspec.
func Connect(ctx context.Context, p Provisioner, proc Process, cfg Config) (*Kernel, error) {
	if cfg.Spec == nil {
		return nil, fmt.Errorf("%w: no kernelspec", ErrConnectFailed)
	}
	if cfg.ID == "" {
		cfg.ID = uuid.NewString()
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return attach(ctx, p, proc, cfg, logger, time.Now(), true)
}

// Reconnect adopts the kernel info names with p and connects to it: what
// a gateway does for each kernel of its store when it starts again. A
// kernel that is not the same live process fails with ErrNotAdoptable
// and nothing is touched.
func Reconnect(ctx context.Context, p Provisioner, info ProvisionerInfo, cfg Config) (*Kernel, error) {
	a, ok := p.(Adopter)
	if !ok {
		return nil, fmt.Errorf("%w: its provisioner cannot adopt kernels", ErrNotAdoptable)
	}
	proc, err := a.Adopt(ctx, info)
	if err != nil {
		return nil, err
	}
	return Connect(ctx, p, proc, cfg)
}

// attach makes the client of proc: it dials, starts the readers and waits
// until the kernel is ready. A start that fails kills proc; a connection
// that fails leaves it running.
func attach(ctx context.Context, p Provisioner, proc Process, cfg Config, logger *slog.Logger, t0 time.Time, connecting bool) (*Kernel, error) {
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
		pending: make(map[string]*Call),
		done:    make(chan struct{}),
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
	chans := []Channel{Shell}
	if connecting {
		chans = []Channel{Control, Shell}
	}
	if err := k.ready(ctx, chans...); err != nil {
		return nil, fail(ctx, err)
	}
	k.log.Debug("kernel ready", "spec", cfg.Spec.Name, "pid", proc.PID(), "took", time.Since(t0), "connected", connecting)
	return k, nil
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
	if ctx.Err() != nil {
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

// Stop ends the kernel process info names without a client: what a
// gateway does with a kept kernel it cannot or will not connect to (one
// whose key no longer answers, a warm-pool kernel of an earlier gateway).
// It signals the process group (SIGTERM, then SIGKILL after grace) only
// while the process is the one info names, then removes its directory,
// cgroup and watchdog. A kernel already gone is no error.
func Stop(ctx context.Context, p Provisioner, info ProvisionerInfo, grace time.Duration) error {
	a, ok := p.(Adopter)
	if !ok {
		return fmt.Errorf("%w: its provisioner cannot adopt kernels", ErrNotAdoptable)
	}
	proc, err := a.Adopt(ctx, info)
	if err != nil {
		if li := info.Local; li != nil && !li.Bridged && errors.Is(err, ErrNotAdoptable) && !sameProcess(li) {
			// Gone: what it left behind goes, its watchdog too.
			stopWatchdog(li.WatchdogPID, li.WatchdogStart)
			os.RemoveAll(li.RuntimeDir)
			return nil
		}
		return err
	}
	proc.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-proc.Done():
		return proc.Cleanup()
	case <-t.C:
	case <-ctx.Done(): // no more grace
	}
	proc.Signal(syscall.SIGKILL)
	t.Reset(killWait)
	select {
	case <-proc.Done():
	case <-t.C:
		release(proc)
		return fmt.Errorf("jupyter: kernel process %d did not exit after SIGKILL", proc.PID())
	}
	return proc.Cleanup()
}

// sameProcess reports whether the process li names still runs.
func sameProcess(li *LocalInfo) bool {
	if li.BootID != "" && li.BootID != bootID() {
		return false
	}
	start, err := processStart(li.PID)
	return err == nil && start == li.StartTime
}

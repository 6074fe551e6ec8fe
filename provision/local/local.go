package local

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"kernelgate/internal/sysproc"
	"kernelgate/internal/tailbuf"
	"kernelgate/kernelspecs"

	"kernelgate/jupyter"
)

// Provisioner runs kernels as child processes of the gateway, each in
// its own process group, with its connection file in a private directory.
type Provisioner struct {
	// RuntimeDir holds one private directory per kernel; empty means
	// $TMPDIR/kernelgate-<uid>. For kernels sandboxed as another user
	// (SandboxConfig.UID) the directories above it must be searchable by
	// that user; the provisioner makes it and the kernels' directories
	// searchable (0711) itself.
	RuntimeDir string
	// Transport is "tcp" (default) or "ipc".
	Transport string
	// IP the kernel binds for tcp; default 127.0.0.1.
	IP string
	// BaseEnv, as KEY=VALUE, is laid over CleanEnv, e.g. to change PATH.
	// Kernels never inherit the gateway's own environment.
	BaseEnv []string
	// OutputTail is how many bytes of the kernel's output are kept;
	// default 8 KiB.
	OutputTail int

	// --- kernel process isolation (limits.go, cgroup.go, sandbox.go) ---

	// Limits bound every kernel unless its launch names its own.
	Limits Limits
	// Sandbox, when set, runs every kernel in bubblewrap unless its launch
	// names its own configuration.
	Sandbox *SandboxConfig
	// Logger gets warnings, such as cgroups being unavailable; nil
	// discards them.
	Logger *slog.Logger
	// HomeSeed, when it exists, is copied into every new kernel's HOME
	// (see PrepareHomeSeed).
	HomeSeed string
	// Detached launches kernels that outlive the gateway (see
	// localinfo.go): kernelgate with a state directory sets it, so a
	// restarted gateway can adopt them again.
	Detached bool
	// StateID names the state store that records the kernels of a
	// Detached provisioner (kernelgate uses its directory): Sweep removes
	// a kernel launched for the same store that the store does not
	// record (its gateway died between the launch and the record).
	StateID string
	// OrphanTimeout is how long a detached kernel lives on once no
	// gateway renews its lease (orphan.go); 0 means
	// DefaultOrphanTimeout.
	OrphanTimeout time.Duration
	// PythonLauncher is LauncherFork (the default when empty: Python
	// kernels are forked from a zygote where they can be, zygote.go) or
	// LauncherExec (every kernel is a new process).
	PythonLauncher string
}

var _ jupyter.Provisioner = (*Provisioner)(nil)

// Capabilities: local kernels take signals (a sandboxed one is
// interrupted by message all the same, as bwrap would get the signal),
// get limits and sandboxes, are adopted again after a restart and are
// local processes.
func (p *Provisioner) Capabilities(*kernelspecs.Spec) jupyter.Capabilities {
	return jupyter.Capabilities{SignalInterrupts: true, Limits: true, Sandbox: true, Reconnect: true}
}

// DefaultRuntimeDir is where kernels' directories go when none is set.
func DefaultRuntimeDir() string {
	return filepath.Join(os.TempDir(), "kernelgate-"+strconv.Itoa(os.Getuid()))
}

func (p *Provisioner) runtimeDir() (string, error) {
	dir := p.RuntimeDir
	if dir == "" {
		dir = DefaultRuntimeDir()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return dir, nil
}

// baseEnv returns the starting environment of a kernel with directories d.
func (p *Provisioner) baseEnv(d KernelDirs) map[string]string {
	env := CleanEnv(d)
	for _, kv := range p.BaseEnv {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env
}

// Launch writes a connection file and starts the spec's argv.
func (p *Provisioner) Launch(ctx context.Context, req jupyter.LaunchRequest) (jupyter.Process, error) {
	if req.Spec == nil || len(req.Spec.Argv) == 0 {
		return nil, fmt.Errorf("%w: no kernelspec argv", jupyter.ErrStartFailed)
	}
	iso, err := p.isolationFor(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", jupyter.ErrStartFailed, err)
	}
	root, err := p.runtimeDir()
	if err != nil {
		return nil, fmt.Errorf("%w: runtime dir: %v", jupyter.ErrStartFailed, err)
	}
	dir, err := os.MkdirTemp(root, "kernel-")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", jupyter.ErrStartFailed, err)
	}
	lp := &localProcess{dir: dir, done: make(chan struct{}), tail: tailbuf.New(p.OutputTail), sandboxed: iso.sandbox != nil}
	fail := func(err error) (jupyter.Process, error) {
		lp.closeOutput()
		lp.cg.remove()
		os.RemoveAll(dir)
		return nil, err
	}
	// The directory says which gateway process made it, so that the next
	// gateway removes it should this one die without doing so (sweep.go).
	if err := writeOwner(dir, req.KernelID, 0, nil, p.StateID); err != nil {
		return fail(fmt.Errorf("%w: %v", jupyter.ErrStartFailed, err))
	}
	// The kernel's own directories (its sandbox user's, sandboxuser.go);
	// dir itself stays the gateway's.
	kd, err := newKernelDirs(filepath.Join(dir, "kernel"))
	if err != nil {
		return fail(fmt.Errorf("%w: %v", jupyter.ErrStartFailed, err))
	}
	if err := copySeed(p.HomeSeed, kd.Home); err != nil {
		return fail(fmt.Errorf("%w: home seed: %v", jupyter.ErrStartFailed, err))
	}
	transport, ip := p.Transport, p.IP
	if transport == "" {
		transport = "tcp"
	}
	if transport == "ipc" {
		ip = filepath.Join(kd.Root, "k")
	} else if ip == "" {
		ip = "127.0.0.1"
	}
	if lp.ci, err = newConnInfo(transport, ip, req.Spec.Name); err != nil {
		return fail(fmt.Errorf("%w: %v", jupyter.ErrStartFailed, err))
	}
	kernelCI := lp.ci
	if iso.bridged(transport) {
		if kernelCI, lp.ci, err = bridgedConnInfo(lp.ci, dir); err != nil {
			return fail(fmt.Errorf("%w: %v", jupyter.ErrStartFailed, err))
		}
	}
	connFile := filepath.Join(kd.Root, "kernel-"+req.KernelID+".json")
	if err := kernelCI.WriteFile(connFile); err != nil {
		return fail(fmt.Errorf("%w: connection file: %v", jupyter.ErrStartFailed, err))
	}
	if iso.sandbox != nil {
		if err := iso.user.handOver(root, kd); err != nil {
			return fail(fmt.Errorf("%w: sandbox user %s: %v", jupyter.ErrStartFailed, iso.user, err))
		}
	}

	env := p.baseEnv(kd)
	argv, specEnv := req.Spec.Command(connFile, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	for k, v := range specEnv {
		env[k] = v
	}
	// What commands beside the kernel keep across a restart (kept, the
	// kernel's info) lacks the client's variables: they may be secrets,
	// which the caller keeps and lays over each command's environment.
	kept := maps.Clone(env)
	for k, v := range req.Env {
		env[k] = v
	}
	for k, v := range req.DirEnv {
		env[k] = v
		kept[k] = v
	}
	// ipykernel exits when this process goes away; in a sandbox its
	// parent is the sandbox's init (pid 1), and --die-with-parent does it.
	if iso.sandbox == nil && !p.Detached && parentPIDEnv {
		env["JPY_PARENT_PID"] = strconv.Itoa(os.Getpid())
	}
	cwd, startDir := req.Cwd, req.Cwd
	if cwd == "" {
		cwd = kd.Work
	}
	if startDir == "" || req.StartFresh {
		startDir = kd.Work
	}
	if lp.cg, err = iso.cgroup(p.logger(), req.KernelID); err != nil {
		return fail(fmt.Errorf("%w: cgroup: %v", jupyter.ErrStartFailed, err))
	}
	plan := commandPlan{env: env, kept: kept, cwd: cwd, iso: iso, runtime: root, kd: kd, cg: lp.cg}
	// A Python kernel is forked from its kernelspec's zygote where it can
	// be (zygote.go); any other starts below.
	if fp, err := p.launchForked(ctx, req, iso, lp, argv, env, startDir); fp != nil || err != nil {
		if err != nil {
			return fail(fmt.Errorf("%w: %v", jupyter.ErrStartFailed, err))
		}
		planForked(fp, plan)
		return fp, nil
	}
	if argv, err = iso.command(argv, env["PATH"], root, kd, cwd, startDir, transport); err != nil {
		return fail(fmt.Errorf("%w: %v", jupyter.ErrStartFailed, err))
	}
	cmd, gate, err := gatedCommand(argv)
	if err != nil {
		return fail(fmt.Errorf("%w: %v", jupyter.ErrStartFailed, err))
	}
	cmd.Env = envList(env)
	cmd.Dir = startDir
	cmd.Stdout, cmd.Stderr = lp.tail, lp.tail
	cmd.SysProcAttr = sysproc.GroupAttr()
	if p.Detached {
		if err := lp.detach(cmd, iso.sandbox != nil); err != nil {
			gate.Close()
			return fail(fmt.Errorf("%w: %v", jupyter.ErrStartFailed, err))
		}
	}
	if iso.sandbox != nil {
		iso.user.setCredential(cmd.SysProcAttr)
	}
	// A kernel's children may hold its output pipes open after it exits.
	cmd.WaitDelay = time.Second
	info, err := iso.infoPipe(cmd, transport)
	if err != nil {
		gate.Close()
		return fail(fmt.Errorf("%w: %v", jupyter.ErrStartFailed, err))
	}
	err = startOnParentThread(cmd) // its Pdeathsig follows that thread (zygote.go)
	closeChildEnds(cmd)
	lp.closeOutput()
	if err != nil {
		gate.Close()
		info.Close()
		return fail(fmt.Errorf("%w: %v", jupyter.ErrStartFailed, err))
	}
	lp.cmd = cmd
	if err := lp.setup(iso, gate, info, kernelCI); err != nil {
		lp.killGroup()
		return fail(fmt.Errorf("%w: %v%s", jupyter.ErrStartFailed, err, outputSuffix(lp.Output())))
	}
	if lp.detached {
		if lp.guard, err = guardOrphan(cmd.Process.Pid, dir, lp.cg, p.guardTimeout(), p.logger()); err != nil {
			lp.killGroup()
			return fail(fmt.Errorf("%w: orphan watchdog: %v", jupyter.ErrStartFailed, err))
		}
	}
	p.recordOwner(dir, req.KernelID, cmd.Process.Pid, lp.cg)
	lp.plan = plan.of(lp.done)
	go lp.wait()
	return lp, nil
}

// recordOwner adds the kernel's process and cgroups to its directory's
// owner record; without them a sweep still removes the directory and the
// cgroups, but cannot find the processes of a kernel without cgroups.
func (p *Provisioner) recordOwner(dir, id string, pid int, cg *kernelCgroup) {
	if err := writeOwner(dir, id, pid, cg, p.StateID); err != nil {
		p.logger().Warn("kernel directory: owner record not updated", "kernel", id, "err", err)
	}
}

func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// localProcess is a kernel running as a child process.
type localProcess struct {
	ci   jupyter.ConnInfo
	dir  string
	cmd  *exec.Cmd
	tail *tailbuf.Buffer

	// isolation (limits.go, cgroup.go, sandbox.go)
	cg        *kernelCgroup // nil without cgroup limits
	bridge    *netBridge    // nil unless a sandbox bridges tcp
	sandboxed bool

	// set for a detached kernel (localinfo.go)
	detached bool
	outFile  string   // its stdout and stderr
	outF     *os.File // this process's copy, until the child started
	guard    *orphanGuard

	plan *commandPlan // how to start commands beside it (command.go)

	done   chan struct{}
	status string // set before done is closed
	reason string // set before done is closed
}

func (lp *localProcess) ConnInfo() jupyter.ConnInfo { return lp.ci }
func (lp *localProcess) PID() int                   { return lp.cmd.Process.Pid }
func (lp *localProcess) Done() <-chan struct{}      { return lp.done }
func (lp *localProcess) Output() string {
	if lp.outFile != "" {
		return fileTail(lp.outFile, outputTailDefault)
	}
	return lp.tail.String()
}

func (lp *localProcess) ExitStatus() string {
	select {
	case <-lp.done:
		return lp.status
	default:
		return ""
	}
}

// wait is the one goroutine that owns cmd.Wait.
func (lp *localProcess) wait() {
	err := lp.cmd.Wait()
	switch {
	case err == nil:
		lp.status = "exit status 0"
	case errors.Is(err, exec.ErrWaitDelay):
		lp.status = lp.cmd.ProcessState.String()
	default:
		lp.status = err.Error()
	}
	lp.reason = lp.exitReason(lp.cmd.ProcessState)
	// Whatever the kernel left in its group (or its cgroup) goes with it.
	sysproc.Kill(-lp.cmd.Process.Pid, syscall.SIGKILL)
	lp.cg.kill()
	lp.bridge.Close()
	close(lp.done)
}

// Signal signals the kernel's process group.
func (lp *localProcess) Signal(sig syscall.Signal) error {
	select {
	case <-lp.done:
		return os.ErrProcessDone
	default:
	}
	return sysproc.Kill(-lp.cmd.Process.Pid, sig)
}

func (lp *localProcess) Cleanup() error {
	lp.guard.end()
	return errors.Join(lp.cg.remove(), os.RemoveAll(lp.dir))
}

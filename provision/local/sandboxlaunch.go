package local

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"kernelgate/internal/sysproc"

	"kernelgate/jupyter"
)

// This file is the part of Provisioner.Launch that isolates a kernel:
// limits, cgroup, sandbox, and the gate between them and the kernel's
// first instruction.

// errNoSandbox refuses a sandbox where bubblewrap cannot run.
var errNoSandbox = errors.New("jupyter: sandboxes (bubblewrap) run on Linux only")

// sandboxInfoWait bounds how long a launch waits for bwrap to say which
// process is the sandbox.
const sandboxInfoWait = 10 * time.Second

// isolation is what one launch applies around the kernel process.
type isolation struct {
	limits  Limits
	sandbox *SandboxConfig // nil: no sandbox
	user    sandboxUser    // who runs a sandbox (sandboxuser.go)
}

// isolationFor checks req and merges its overrides with the defaults of p.
func (p *Provisioner) isolationFor(req jupyter.LaunchRequest) (isolation, error) {
	if err := ValidateEnv(req.Env); err != nil {
		return isolation{}, err
	}
	iso := isolation{limits: p.Limits, sandbox: p.Sandbox}
	switch o := req.Options.(type) {
	case nil:
	case *Options:
		if o.Limits != nil {
			iso.limits = *o.Limits
		}
		if o.Sandbox != nil {
			iso.sandbox = o.Sandbox
		}
	default:
		return isolation{}, fmt.Errorf("options of type %T are not the local provisioner's", req.Options)
	}
	if iso.sandbox != nil {
		if runtime.GOOS != "linux" {
			return isolation{}, errNoSandbox
		}
		u, err := iso.sandbox.user()
		if err != nil {
			return isolation{}, fmt.Errorf("sandbox: %w", err)
		}
		iso.user = u
	}
	return iso, iso.limits.validate()
}

func (p *Provisioner) logger() *slog.Logger {
	if p.Logger != nil {
		return p.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// bridged says whether the kernel sits in a network namespace of its own
// but speaks tcp, so that the gateway reaches it through a netBridge.
func (iso isolation) bridged(transport string) bool {
	return iso.sandbox != nil && !iso.sandbox.Network && transport != "ipc"
}

// bridgedConnInfo splits ci into what a bridged kernel binds (tcp on its
// own loopback) and how the gateway reaches it: unix sockets in a
// directory below dir that only the gateway may enter (the sandbox does
// not show dir, and its user may search it but not this directory).
func bridgedConnInfo(ci jupyter.ConnInfo, dir string) (kernel, gw jupyter.ConnInfo, err error) {
	private := filepath.Join(dir, "gw")
	if err := os.Mkdir(private, 0o700); err != nil {
		return ci, ci, err
	}
	kernel, gw = ci, ci
	kernel.Transport, kernel.IP = "tcp", "127.0.0.1"
	gw.Transport, gw.IP = "ipc", filepath.Join(private, "k")
	return kernel, gw, nil
}

var (
	// hostCgroups is what the machine offers, found once per process.
	hostCgroups   = sync.OnceValues(detectCgroups)
	cgroupWarning sync.Once
)

// cgroup makes the kernel's cgroup when its limits need one. Where the
// machine has no usable cgroups it logs so once and returns nil: memory and
// process limits are best effort, the rlimits still apply.
func (iso isolation) cgroup(log *slog.Logger, kernelID string) (*kernelCgroup, error) {
	warnUnenforced(log, iso.limits) // the rlimits, where they cannot be set
	host, err := hostCgroups()
	switch {
	case err != nil && !iso.limits.needsCgroup():
		return nil, nil // no limits asked for: a process group will do
	case err != nil:
		cgroupWarning.Do(func() {
			log.Warn("cgroups unavailable: kernel memory and process limits are not enforced", "err", err)
		})
		return nil, nil
	case len(host.missing) > 0:
		cgroupWarning.Do(func() {
			log.Warn("cgroup controllers unavailable: their kernel limits are not enforced", "controllers", host.missing)
		})
	}
	return host.create(cgroupName(kernelID), iso.limits)
}

// cgroupName is the kernel id made safe for a directory name, plus a
// random suffix, so a restarted kernel never meets its predecessor's
// cgroup, and the mark of this gateway process (sweep.go).
func cgroupName(kernelID string) string {
	b := make([]byte, 4)
	rand.Read(b)
	name := "k-" + cleanID(kernelID) + "-" + hex.EncodeToString(b)
	if g, ok := thisGateway(); ok {
		name += "." + g.tag()
	}
	return name
}

// command resolves argv[0] with the kernel's PATH and, for a sandbox,
// puts bwrap and its options in front.
func (iso isolation) command(argv []string, path, runtime string, kd KernelDirs, cwd, startDir, transport string) ([]string, error) {
	exe, err := lookPath(argv[0], path)
	if err != nil {
		return nil, err
	}
	argv = append([]string{exe}, argv[1:]...)
	if iso.sandbox == nil {
		return argv, nil
	}
	bwrap, err := iso.sandbox.bwrapPath()
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if err := writeHideFiles(kd); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	infoFD := 0
	if iso.bridged(transport) {
		infoFD = sandboxInfoFD
	}
	args, err := iso.sandbox.bwrapArgs(iso.user, runtime, kd, cwd, startDir, exe, infoFD)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	out := append([]string{bwrap}, args...)
	return append(out, argv...), nil
}

// infoPipe gives a bridged sandbox bwrap's info descriptor and returns
// the end to read it from; nil when not bridged.
func (iso isolation) infoPipe(cmd *exec.Cmd, transport string) (*os.File, error) {
	if !iso.bridged(transport) {
		return nil, nil
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, w) // fd 4 = sandboxInfoFD
	return r, nil
}

// closeChildEnds closes the gateway's copies of the descriptors given to
// the child.
func closeChildEnds(cmd *exec.Cmd) {
	for _, f := range cmd.ExtraFiles {
		f.Close()
	}
}

// setup runs while the child waits at the gate: it joins the cgroup, sets
// the rlimits and opens the gate; then, for a bridged sandbox, it finds
// the sandbox's network namespace and starts the bridge. On error the
// caller kills the child.
func (lp *localProcess) setup(iso isolation, gate, info *os.File, kernelCI jupyter.ConnInfo) error {
	pid := lp.cmd.Process.Pid
	err := func() error {
		if lp.cg != nil {
			if err := lp.cg.join(pid); err != nil {
				return fmt.Errorf("cgroup: %w", err)
			}
		}
		// The child already runs as the sandbox user, if any.
		if err := iso.user.peerOf(func() error { return iso.limits.setRlimits(pid) }); err != nil {
			return err
		}
		return openGate(gate)
	}()
	if err != nil {
		gate.Close()
		if info != nil {
			info.Close()
		}
		return err
	}
	if info == nil {
		return nil
	}
	defer info.Close()
	child, err := readSandboxPid(info, sandboxInfoWait)
	if err != nil {
		return err
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", child))
	if err != nil {
		return fmt.Errorf("sandbox network namespace: %w", err)
	}
	// The namespace is the sandbox's if the process is still bwrap's child
	// once it is open (so its pid was not reused meanwhile).
	if ppid, err := parentOf(child); err != nil || ppid != pid {
		ns.Close()
		return fmt.Errorf("sandbox process %d went away", child)
	}
	if lp.bridge, err = startBridge(ns, kernelCI, lp.ci); err != nil {
		if errors.Is(err, syscall.EPERM) {
			return fmt.Errorf("sandbox network bridge: a kernel that speaks tcp only is reached inside its network namespace, which only a gateway running as root may enter; give it the network (--sandbox-network, or metadata.kernelgate.network) to run it as another user: %w", err)
		}
		return fmt.Errorf("sandbox network bridge: %w", err)
	}
	return nil
}

// exitReason says why the process ended beyond its status: the OOM killer
// of its cgroup killed it.
func (lp *localProcess) exitReason(ps *os.ProcessState) string {
	if lp.cg != nil && killedBySignal(ps) && lp.cg.oomKills() > 0 {
		return ReasonOutOfMemory
	}
	return ""
}

// ExitReason implements jupyter.Process.
func (lp *localProcess) ExitReason() string {
	select {
	case <-lp.done:
		return lp.reason
	default:
		return ""
	}
}

// InterruptByMessage implements messageInterrupter: SIGINT to bwrap would
// end the sandbox, and on Windows there is no SIGINT to send.
func (lp *localProcess) InterruptByMessage() bool {
	return lp.sandboxed || !sysproc.SignalInterrupts
}

// outputSuffix is ": out" for a non-empty kernel output.
func outputSuffix(out string) string {
	if out = strings.TrimSpace(out); out != "" {
		return ": " + out
	}
	return ""
}

// killGroup kills a child that never got to wait() and reaps it.
func (lp *localProcess) killGroup() {
	sysproc.Kill(-lp.cmd.Process.Pid, syscall.SIGKILL)
	lp.cmd.Wait()
}

var (
	_ messageInterrupter = (*localProcess)(nil)
)

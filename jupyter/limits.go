package jupyter

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// Limits bound the resources of one kernel and of every process it starts.
// Memory and process count need cgroups (v1 or v2); where the gateway
// cannot create cgroups they are not enforced and the provisioner logs so
// once. The rlimits always apply. RLIMIT_AS is never used: Deno aborts at
// start under it.
type Limits struct {
	// MemoryBytes caps the memory of the kernel's cgroup; past it the
	// kernel is killed by the OOM killer and its DiedError says
	// "out of memory". 0 means no limit.
	MemoryBytes int64
	// Pids caps the processes and threads of the kernel's cgroup; past it
	// fork and thread creation fail with EAGAIN. 0 means no limit.
	Pids int
	// NoFile is RLIMIT_NOFILE, soft and hard; 0 keeps the gateway's.
	NoFile uint64
	// Core is RLIMIT_CORE in bytes, soft and hard; 0, the default, means
	// no core dumps, RlimitInfinity means no limit.
	Core uint64
}

// RlimitInfinity as Limits.NoFile or Limits.Core means no limit.
const RlimitInfinity = ^uint64(0)

func (l Limits) validate() error {
	if l.MemoryBytes < 0 || l.Pids < 0 {
		return fmt.Errorf("jupyter: negative limit in %+v", l)
	}
	return nil
}

// needsCgroup says whether l can only be enforced with a cgroup.
func (l Limits) needsCgroup() bool { return l.MemoryBytes > 0 || l.Pids > 0 }

// setRlimits applies the rlimits of l to the process pid.
func (l Limits) setRlimits(pid int) error {
	if l.NoFile > 0 {
		if err := prlimit(pid, syscall.RLIMIT_NOFILE, l.NoFile); err != nil {
			return fmt.Errorf("RLIMIT_NOFILE: %w", err)
		}
	}
	if err := prlimit(pid, syscall.RLIMIT_CORE, l.Core); err != nil {
		return fmt.Errorf("RLIMIT_CORE: %w", err)
	}
	return nil
}

// prlimit sets the soft and hard limit of resource of process pid to v.
func prlimit(pid, resource int, v uint64) error {
	return unix.Prlimit(pid, resource, &unix.Rlimit{Cur: v, Max: v}, nil)
}

// Go's exec has no hook between fork and exec, so a kernel starts behind a
// gate: /bin/sh waits for one line on fd 3, then closes it and execs the
// kernel (or bwrap) in place, keeping its pid. While it waits the gateway
// moves that pid into the kernel's cgroups and sets its rlimits, so the
// kernel's first instruction already runs under every limit and every
// process it forks inherits them: there is no window. EOF on the gate (the
// gateway died or gave up) makes the shell exit without running anything.
// The shell's own PWD is not passed on.
const gateScript = `read -r go <&3 || exit 125; exec 3<&-; unset PWD; exec "$@"`

// gateShell runs gateScript.
const gateShell = "/bin/sh"

// gatedCommand returns a command that starts argv behind the gate, and the
// write end of the gate. argv[0] must be an absolute path.
func gatedCommand(argv []string) (*exec.Cmd, *os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	args := append([]string{"-c", gateScript, "kernelgate-gate"}, argv...)
	cmd := exec.Command(gateShell, args...)
	cmd.ExtraFiles = []*os.File{r}
	return cmd, w, nil
}

// openGate lets the gated child become the kernel.
func openGate(w *os.File) error {
	_, err := w.Write([]byte("go\n"))
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return err
}

// exitReasoner is implemented by a Process that can tell why it was
// killed, e.g. by the OOM killer of its cgroup. Other provisioners need
// not implement it.
type exitReasoner interface {
	// ExitReason is why the process ended, e.g. "out of memory", or ""
	// when nothing beyond its exit status is known. Valid once Done is
	// closed.
	ExitReason() string
}

// exitReason asks p why it ended when it can say.
func exitReason(p Process) string {
	if r, ok := p.(exitReasoner); ok {
		return r.ExitReason()
	}
	return ""
}

// ReasonOutOfMemory is the DiedError.Reason of a kernel killed by the OOM
// killer of its cgroup.
const ReasonOutOfMemory = "out of memory"

// killedBySignal says whether the process ended by SIGKILL, directly or,
// behind bwrap or a shell, as exit status 128+9.
func killedBySignal(ps *os.ProcessState) bool {
	if ps == nil {
		return false
	}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	if !ok {
		return false
	}
	return (ws.Signaled() && ws.Signal() == syscall.SIGKILL) || (ws.Exited() && ws.ExitStatus() == 128+int(syscall.SIGKILL))
}

var errNoCgroups = errors.New("jupyter: no writable cgroup hierarchy for memory or pids")

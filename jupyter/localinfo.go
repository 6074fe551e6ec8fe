package jupyter

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
)

// Detached kernels: LocalProvisioner.Detached launches a kernel that does
// not end with the gateway, so that a gateway started again on the same
// state directory adopts it (Adopt) and connects to it (Connect):
//   - no Pdeathsig and no JPY_PARENT_PID (ipykernel's parent poller), and
//     a bubblewrap sandbox without --die-with-parent;
//   - a session of its own (setsid), so a terminal's hangup or Ctrl-C
//     that reaches the gateway does not reach the kernel;
//   - its stdout and stderr go to a file in its directory rather than
//     into a pipe that would break with the gateway.
//
// A kernel left behind must not live forever when no gateway comes back
// (docs/state.md has the design; it is not built yet): each detached
// kernel gets a lease file in its directory that every gateway attached
// to it renews (one ticker for all its kernels, every 30s), and a small
// watchdog process beside it, in a session of its own, that stops the
// kernel's process group (SIGTERM, then SIGKILL) and removes its
// directory and cgroup once the lease is older than the orphan bound
// (--orphan-timeout, say 15 minutes), or exits when the kernel does. A
// rolling restart (--keep-kernels) renews the lease within the bound; a
// gateway killed for good, or a store lost as damaged, leaves no kernel
// running past it. A starting gateway also stops every stored kernel it
// cannot adopt.

// outputFileName is a detached kernel's stdout and stderr, in its
// directory.
const outputFileName = "output.log"

// detach makes cmd start a kernel that outlives this process.
func (lp *localProcess) detach(cmd *exec.Cmd, sandboxed bool) error {
	lp.detached = true
	cmd.SysProcAttr.Setpgid, cmd.SysProcAttr.Pdeathsig = false, 0
	cmd.SysProcAttr.Setsid = true // a new session and process group
	lp.outFile = filepath.Join(lp.dir, outputFileName)
	f, err := os.OpenFile(lp.outFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	// The child gets the descriptor itself; this process's copy is
	// closed once it has started (cmd.Stdout is an *os.File, so exec
	// copies nothing).
	cmd.Stdout, cmd.Stderr = f, f
	lp.outF = f
	if sandboxed {
		cmd.Args = slices.DeleteFunc(cmd.Args, func(a string) bool { return a == "--die-with-parent" })
	}
	return nil
}

// ProvisionerInfo says how to find and control the kernel again.
func (lp *localProcess) ProvisionerInfo() (ProvisionerInfo, error) {
	pid := lp.cmd.Process.Pid
	if lp.exited() {
		return ProvisionerInfo{}, fmt.Errorf("%w: the process has ended", ErrNotAdoptable)
	}
	start, err := processStart(pid)
	// Until wait has reaped it the pid is the kernel's: if it has not
	// ended after the read, the start time read was its own.
	if err != nil || lp.exited() {
		return ProvisionerInfo{}, fmt.Errorf("%w: process %d: %v", ErrNotAdoptable, pid, err)
	}
	li := &LocalInfo{PID: pid, StartTime: start, BootID: bootID(), PGID: pid, RuntimeDir: lp.dir,
		OutputFile: lp.outFile, Sandboxed: lp.sandboxed, Bridged: lp.bridge != nil, Detached: lp.detached}
	if lp.cg != nil {
		for _, l := range lp.cg.snapshot() {
			li.Cgroups = append(li.Cgroups, CgroupInfo{Dir: l.dir, V2: l.v2, Controllers: l.controllers})
		}
	}
	return ProvisionerInfo{Provisioner: "local", Connection: lp.ci, Local: li}, nil
}

func (lp *localProcess) exited() bool {
	select {
	case <-lp.done:
		return true
	default:
		return false
	}
}

// closeOutput closes this process's copy of a detached kernel's output
// file once the child has it.
func (lp *localProcess) closeOutput() {
	if lp.outF != nil {
		lp.outF.Close()
		lp.outF = nil
	}
}

var _ InfoProcess = (*localProcess)(nil)

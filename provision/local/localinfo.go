package local

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"kernelgate/internal/sysproc"

	"kernelgate/jupyter"
)

// Detached kernels: Provisioner.Detached launches a kernel that does
// not end with the gateway, so that a gateway started again on the same
// state directory adopts it (Adopt) and connects to it (Connect):
//   - no Pdeathsig and no JPY_PARENT_PID (ipykernel's parent poller), and
//     a bubblewrap sandbox without --die-with-parent;
//   - a session of its own (setsid), so a terminal's hangup or Ctrl-C
//     that reaches the gateway does not reach the kernel;
//   - its stdout and stderr go to a file in its directory rather than
//     into a pipe that would break with the gateway.
//
// A kernel left behind must not live forever when no gateway comes back:
// orphan.go gives each detached kernel a lease and a watchdog.

// outputFileName is a detached kernel's stdout and stderr, in its
// directory.
const outputFileName = "output.log"

// detach makes cmd start a kernel that outlives this process.
func (lp *localProcess) detach(cmd *exec.Cmd, sandboxed bool) error {
	lp.detached = true
	cmd.SysProcAttr = sysproc.SessionAttr() // a new session and process group
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
func (lp *localProcess) ProvisionerInfo() (jupyter.ProvisionerInfo, error) {
	li := &Info{RuntimeDir: lp.dir, OutputFile: lp.outFile, Sandboxed: lp.sandboxed,
		Bridged: lp.bridge != nil, Detached: lp.detached, Command: lp.plan.info()}
	return localInfo(lp.ci, lp.cmd.Process.Pid, lp.done, lp.guard, lp.cg, li)
}

// localInfo completes li with what identifies the running process pid (a
// child of this process, reaped once done is closed), its lease and its
// cgroups.
func localInfo(ci jupyter.ConnInfo, pid int, done <-chan struct{}, g *orphanGuard, cg *kernelCgroup, li *Info) (jupyter.ProvisionerInfo, error) {
	if closed(done) {
		return jupyter.ProvisionerInfo{}, fmt.Errorf("%w: the process has ended", jupyter.ErrNotAdoptable)
	}
	start, err := processStart(pid)
	// Until it is reaped the pid is the kernel's: if it has not ended
	// after the read, the start time read was its own.
	if err != nil || closed(done) {
		return jupyter.ProvisionerInfo{}, fmt.Errorf("%w: process %d: %v", jupyter.ErrNotAdoptable, pid, err)
	}
	li.PID, li.StartTime, li.BootID, li.PGID = pid, start, bootID(), pid
	li.Hostname, li.PidNS = thisHost().name, thisHost().pidNS
	if g != nil {
		li.Lease, li.OrphanTimeout, li.WatchdogPID, li.WatchdogStart = g.lease, g.timeout, g.wdPID, g.wdStart
	}
	if cg != nil {
		for _, l := range cg.snapshot() {
			li.Cgroups = append(li.Cgroups, CgroupInfo{Dir: l.dir, V2: l.v2, Controllers: l.controllers})
		}
	}
	return li.provisionerInfo(ci)
}

func closed(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// guardOrphan gives the detached kernel pid, with its directory and
// cgroup, its lease and watchdog; log gets the renewals that fail.
func guardOrphan(pid int, dir string, cg *kernelCgroup, timeout time.Duration, log *slog.Logger) (*orphanGuard, error) {
	start, err := processStart(pid)
	if err != nil {
		return nil, err
	}
	g, err := newGuard(dir, timeout, log)
	if err != nil {
		return nil, err
	}
	var cgroups []string
	for _, l := range cg.snapshot() {
		cgroups = append(cgroups, l.dir)
	}
	if err := g.startWatchdog(pid, start, dir, cgroups); err != nil {
		g.release()
		return nil, err
	}
	return g, nil
}

// Release stops renewing the kernel's lease (Kernel.Detach): the kernel
// has the orphan timeout to be adopted again. The process stays watched
// by wait until it ends.
func (lp *localProcess) Release() { lp.guard.release() }

// closeOutput closes this process's copy of a detached kernel's output
// file once the child has it.
func (lp *localProcess) closeOutput() {
	if lp.outF != nil {
		lp.outF.Close()
		lp.outF = nil
	}
}

var (
	_ jupyter.InfoProcess = (*localProcess)(nil)
	_ jupyter.Releaser    = (*localProcess)(nil)
)

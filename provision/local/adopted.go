package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"kernelgate/internal/sysproc"

	"kernelgate/jupyter"
)

// This file re-adopts a local kernel that is not a child of this process:
// one a gateway launched before it restarted. Such a process cannot be
// reaped or waited for; its exit is learnt from a pidfd (Linux 5.3 and
// later, adopted_linux.go), its group is signalled, and its directory and
// cgroup are removed once it has ended.

// ExitUnknown is the exit status of a process that was not our child:
// only its parent learns how it ended.
const ExitUnknown = "unknown (not a child)"

// Adopt takes over the local kernel process info names, if it is still
// the very process that was launched: same host and pid namespace
// (host.go), same pid, same start time, same boot. Nothing is signalled
// or changed when it is not.
func (p *Provisioner) Adopt(ctx context.Context, info jupyter.ProvisionerInfo) (jupyter.Process, error) {
	li, err := InfoOf(info)
	switch {
	case err != nil:
		return nil, err
	case li.PID <= 0 || li.StartTime == 0:
		return nil, fmt.Errorf("%w: no pid and start time", jupyter.ErrNotAdoptable)
	case li.Bridged:
		return nil, fmt.Errorf("%w: its sandbox's network bridge ended with the gateway that ran it", jupyter.ErrNotAdoptable)
	case li.elsewhere() != nil:
		return nil, li.elsewhere()
	case li.BootID != "" && li.BootID != bootID():
		return nil, fmt.Errorf("%w: the machine has restarted since", jupyter.ErrNotAdoptable)
	}
	// The pidfd is taken first: if the start time matches after it, the
	// pidfd is the kernel's and no later reuse of the pid can fool it.
	w, err := watchPID(li.PID)
	if err != nil {
		return nil, fmt.Errorf("%w: process %d: %v", jupyter.ErrNotAdoptable, li.PID, err)
	}
	start, err := processStart(li.PID)
	switch {
	case err != nil:
		w.close()
		return nil, fmt.Errorf("%w: process %d: %v", jupyter.ErrNotAdoptable, li.PID, err)
	case start != li.StartTime:
		w.close()
		return nil, fmt.Errorf("%w: pid %d is another process now (started at tick %d, the kernel at %d)", jupyter.ErrNotAdoptable, li.PID, start, li.StartTime)
	}
	ap := &adoptedProcess{info: info, li: li, w: w, done: make(chan struct{}), watching: make(chan struct{})}
	if len(li.Cgroups) > 0 {
		ap.cg = &kernelCgroup{}
		for _, c := range li.Cgroups {
			ap.cg.leaves = append(ap.cg.leaves, cgLeaf{cgHierarchy: cgHierarchy{v2: c.V2, controllers: c.Controllers}, dir: c.Dir})
		}
	}
	if li.Command != nil {
		if ap.plan, err = li.Command.plan(ap.cg, ap.done); err != nil {
			// The kernel serves all the same; its commands answer
			// jupyter.ErrNoCommands.
			p.logger().Warn("an adopted kernel cannot run commands beside it", "pid", li.PID, "err", err)
		}
	}
	if li.Lease != "" {
		// This gateway answers for the kernel now: its lease is renewed
		// from here on.
		timeout := li.OrphanTimeout
		if timeout <= 0 {
			timeout = p.guardTimeout()
		}
		if ap.guard, err = newGuard(filepath.Dir(li.Lease), timeout, p.logger()); err != nil {
			w.close()
			return nil, fmt.Errorf("%w: lease: %v", jupyter.ErrNotAdoptable, err)
		}
		ap.guard.wdPID, ap.guard.wdStart = li.WatchdogPID, li.WatchdogStart
	}
	go ap.watch()
	return ap, nil
}

// adoptedProcess is a local kernel that is not our child.
type adoptedProcess struct {
	info  jupyter.ProvisionerInfo
	li    *Info // info's Data
	cg    *kernelCgroup
	w     *pidWatcher
	guard *orphanGuard // nil unless the kernel has a lease
	plan  *commandPlan // nil for an info without CommandInfo (commandinfo.go)

	done     chan struct{} // closed when the process has ended
	watching chan struct{} // closed when watch returns
	relOnce  sync.Once
}

var (
	_ jupyter.InfoProcess = (*adoptedProcess)(nil)
	_ jupyter.Releaser    = (*adoptedProcess)(nil)
	_ messageInterrupter  = (*adoptedProcess)(nil)
)

// watch waits for the process to end, then kills what it left in its
// group and cgroup, as the wait of a child does.
func (ap *adoptedProcess) watch() {
	defer close(ap.watching)
	if !ap.w.wait() {
		return // released
	}
	sysproc.Kill(-ap.li.PGID, syscall.SIGKILL)
	ap.cg.kill()
	close(ap.done)
}

func (ap *adoptedProcess) ConnInfo() jupyter.ConnInfo { return ap.info.Connection }
func (ap *adoptedProcess) PID() int                   { return ap.li.PID }
func (ap *adoptedProcess) Done() <-chan struct{}      { return ap.done }

func (ap *adoptedProcess) ExitStatus() string {
	select {
	case <-ap.done:
		return ExitUnknown
	default:
		return ""
	}
}

// Output is the end of the kernel's output file, when it has one.
func (ap *adoptedProcess) Output() string {
	return fileTail(ap.li.OutputFile, outputTailDefault)
}

// Signal signals the kernel's process group while the kernel lives.
func (ap *adoptedProcess) Signal(sig syscall.Signal) error {
	select {
	case <-ap.done:
		return os.ErrProcessDone
	default:
	}
	return sysproc.Kill(-ap.li.PGID, sig)
}

// Release stops watching the process and leaves it running.
func (ap *adoptedProcess) Release() {
	ap.relOnce.Do(func() {
		ap.guard.release()
		ap.w.stop()
		<-ap.watching
		ap.w.close()
	})
}

// Cleanup removes the kernel's cgroup and directory. Call it after Done.
func (ap *adoptedProcess) Cleanup() error {
	ap.Release()
	ap.guard.end()
	return errors.Join(ap.cg.remove(), os.RemoveAll(ap.li.RuntimeDir))
}

func (ap *adoptedProcess) ProvisionerInfo() (jupyter.ProvisionerInfo, error) { return ap.info, nil }

// InterruptByMessage implements messageInterrupter.
func (ap *adoptedProcess) InterruptByMessage() bool { return ap.li.Sandboxed }

// outputTailDefault is how much of an output file Output returns.
const outputTailDefault = 8 << 10

// fileTail returns the last n bytes of the file at path ("" when none).
func fileTail(path string, n int64) string {
	if path == "" {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		f.Seek(fi.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return string(b)
}

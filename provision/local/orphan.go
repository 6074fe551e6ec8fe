package local

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"kernelgate/internal/sysproc"
)

// A detached kernel must not outlive every gateway for good. Each one has
// a lease, a file in its directory holding the Unix time until which a
// gateway answers for it, and a watchdog beside it: a small shell in a
// session of its own that stops the kernel's process group (SIGTERM, then
// SIGKILL after a grace), removes its cgroups and directory once the lease
// has run out, and exits when the kernel does. Whichever gateway holds the
// kernel (the one that launched it, or one that adopted it) renews the
// lease every third of the orphan timeout; Detach, a gateway stopped with
// --keep-kernels, or one that died, stops renewing, and a gateway that
// starts again within the timeout adopts the kernel and renews it again.

// DefaultOrphanTimeout is how long a detached kernel lives on with no
// gateway renewing its lease.
const DefaultOrphanTimeout = 15 * time.Minute

// leaseFileName is the lease in a kernel's directory.
const leaseFileName = "lease"

// orphanGrace is how long the watchdog waits after SIGTERM.
const orphanGrace = 5

// watchdogScript: $1 kernel pid (its group and session leader), $2 its
// start time (field 22 of /proc/<pid>/stat), $3 lease file, $4 kernel
// directory, $5 seconds between checks, $6 grace in seconds, then the
// kernel's cgroup directories.
const watchdogScript = `pid=$1 start=$2 lease=$3 dir=$4 every=$5 grace=$6; shift 6
alive() {
	s=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null) || return 1
	set -- $s
	[ "$1" != Z ] && [ "${20}" = "$start" ]
}
while alive; do
	exp=$(cat "$lease" 2>/dev/null)
	if [ "$(date +%s)" -gt "${exp:-0}" ]; then
		kill -s TERM -- "-$pid" 2>/dev/null
		n=0
		while alive && [ "$n" -lt "$grace" ]; do sleep 1; n=$((n+1)); done
		alive && kill -s KILL -- "-$pid" 2>/dev/null
		for cg in "$@"; do
			for p in $(cat "$cg/cgroup.procs" 2>/dev/null); do kill -s KILL "$p" 2>/dev/null; done
			rmdir "$cg" 2>/dev/null
		done
		rm -rf "$dir"
		exit 0
	fi
	sleep "$every"
done`

// orphanGuard renews a kernel's lease and, when this process started it,
// owns its watchdog.
type orphanGuard struct {
	lease   string
	timeout time.Duration
	log     *slog.Logger

	stopOnce sync.Once
	stop     chan struct{}
	renewing sync.WaitGroup

	// the watchdog: a child of this process (cmd, reaped by wdDone) or
	// one started by an earlier gateway (pid and start time)
	wdCmd   *exec.Cmd
	wdDone  chan struct{}
	wdPID   int
	wdStart uint64
}

// guardTimeout is the orphan timeout of p.
func (p *Provisioner) guardTimeout() time.Duration {
	if p.OrphanTimeout > 0 {
		return p.OrphanTimeout
	}
	return DefaultOrphanTimeout
}

// newGuard writes the lease of a kernel in dir and starts renewing it;
// log gets the renewals that fail.
func newGuard(dir string, timeout time.Duration, log *slog.Logger) (*orphanGuard, error) {
	g := &orphanGuard{lease: filepath.Join(dir, leaseFileName), timeout: timeout, log: log, stop: make(chan struct{})}
	if err := g.renew(); err != nil {
		return nil, err
	}
	g.renewing.Add(1)
	go g.renewLoop()
	return g, nil
}

// renew moves the lease's end to now plus the timeout.
func (g *orphanGuard) renew() error {
	until := time.Now().Add(g.timeout).Unix()
	tmp := g.lease + ".new"
	if err := os.WriteFile(tmp, []byte(strconv.FormatInt(until, 10)+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, g.lease)
}

// renewLoop renews the lease every third of the timeout, at times aligned
// on the wall clock (multiples of the period), so that the guards of all
// the kernels wake the gateway once per period rather than each at its own
// moment: idle kernels cost one wakeup every few minutes. A renewal that
// fails (a full disk, a directory removed) is logged and tried again every
// tenth of the period until one succeeds: the watchdog stops the kernel
// once the lease it reads has run out.
func (g *orphanGuard) renewLoop() {
	defer g.renewing.Done()
	every := max(g.timeout/3, 100*time.Millisecond)
	retry := max(every/10, 100*time.Millisecond)
	t := time.NewTimer(untilNextMultiple(time.Now(), every))
	defer t.Stop()
	failing := false
	for {
		select {
		case <-t.C:
			err := g.renew()
			switch {
			case err != nil && !failing:
				g.log.Warn("kernel lease not renewed: trying again", "lease", g.lease, "retry", retry, "err", err)
			case err == nil && failing:
				g.log.Info("kernel lease renewed again", "lease", g.lease)
			}
			failing = err != nil
			if failing {
				t.Reset(retry)
			} else {
				t.Reset(untilNextMultiple(time.Now(), every))
			}
		case <-g.stop:
			return
		}
	}
}

// untilNextMultiple is the time from now to the next multiple of every
// since the zero time (never zero: a whole period at a multiple).
func untilNextMultiple(now time.Time, every time.Duration) time.Duration {
	return now.Truncate(every).Add(every).Sub(now)
}

// release stops renewing: the kernel now has the orphan timeout to be
// adopted again.
func (g *orphanGuard) release() {
	if g == nil {
		return
	}
	g.stopOnce.Do(func() { close(g.stop) })
	g.renewing.Wait()
}

// watchdogArgs is the watchdog's command line after the shell:
// -c script kernelgate-watchdog pid start lease dir every grace cgroups...
// (parseWatchdogArgs reads it back from /proc).
func watchdogArgs(pid int, start uint64, lease, dir string, every int, cgroups []string) []string {
	args := []string{"-c", watchdogScript, watchdogName, strconv.Itoa(pid), strconv.FormatUint(start, 10),
		lease, dir, strconv.Itoa(every), strconv.Itoa(orphanGrace)}
	return append(args, cgroups...)
}

// parseWatchdogArgs returns the kernel directory and cgroups of a
// watchdog's command line (the shell first), if it is one.
func parseWatchdogArgs(cmdline []string) (dir string, cgroups []string, ok bool) {
	// sh, then watchdogArgs: -c script name pid start lease dir every grace cgroups...
	if len(cmdline) < 10 || cmdline[3] != watchdogName {
		return "", nil, false
	}
	return cmdline[7], cmdline[10:], true
}

// startWatchdog starts the watchdog of kernel pid, started at start, with
// its cgroup directories.
func (g *orphanGuard) startWatchdog(pid int, start uint64, dir string, cgroups []string) error {
	every := int(min(max(g.timeout/4, time.Second), 30*time.Second) / time.Second)
	cmd := exec.Command(gateShell, watchdogArgs(pid, start, g.lease, dir, every, cgroups)...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = sysproc.SessionAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	g.wdCmd, g.wdDone, g.wdPID = cmd, make(chan struct{}), cmd.Process.Pid
	g.wdStart, _ = processStart(g.wdPID)
	go func() {
		cmd.Wait()
		close(g.wdDone)
	}()
	return nil
}

// end is called once the kernel has ended and been cleaned up: the lease
// is no longer renewed and the watchdog, its work done, is stopped.
func (g *orphanGuard) end() {
	if g == nil {
		return
	}
	g.release()
	switch {
	case g.wdCmd != nil:
		// Its group: the shell and the sleep it waits on.
		sysproc.Kill(-g.wdCmd.Process.Pid, syscall.SIGKILL)
		<-g.wdDone
	case g.wdPID > 0:
		stopWatchdog(g.wdPID, g.wdStart)
	}
}

// stopWatchdog ends an earlier gateway's watchdog (its process group:
// the shell and its sleep), only if pid is still that process.
func stopWatchdog(pid int, start uint64) {
	if pid <= 0 {
		return
	}
	if w, err := watchPID(pid); err == nil {
		if s, err := processStart(pid); err == nil && s == start {
			sysproc.Kill(-pid, syscall.SIGKILL)
		}
		w.close()
	}
}

package local

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// Limits bound the resources of one kernel and of every process it starts.
// Memory and process count need cgroups (v1 or v2); where the gateway
// cannot create cgroups they are not enforced and the provisioner logs so
// once. The rlimits apply on Linux (prlimit); elsewhere they are not
// enforced either, and the provisioner logs so once. RLIMIT_AS is never used: Deno aborts at
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

// gateShell runs gateScript (gate_unix.go) and the orphan watchdog.
const gateShell = "/bin/sh"

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

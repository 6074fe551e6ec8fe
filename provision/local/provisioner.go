package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
)

// Name is the local provisioner's name, as kernelspecs give it in
// metadata.kernel_provisioner.provisioner_name (jupyter_client's
// convention).
const Name = "local-provisioner"

// InfoName is the provisioner name the ProvisionerInfo of a local kernel
// gives, as it always has: register the provisioner under it too
// (jupyter.Registry.Alias) so that kept kernels are adopted.
const InfoName = "local"

// Options are what a launch may set of the local provisioner's
// configuration (jupyter.LaunchRequest.Options): each field, when set,
// replaces the provisioner's own.
type Options struct {
	Limits  *Limits
	Sandbox *SandboxConfig
}

// MemoryLimit is the memory limit of the options' Limits, 0 when none:
// what another provisioner that bounds memory its own way applies.
func (o *Options) MemoryLimit() int64 {
	if o == nil || o.Limits == nil {
		return 0
	}
	return o.Limits.MemoryBytes
}

// Info is how a local kernel process is found and controlled again: the
// Data of its jupyter.ProvisionerInfo.
type Info struct {
	// PID and StartTime (field 22 of /proc/<pid>/stat, in clock ticks
	// since boot) name the process: a pid reused by another process has
	// another start time. BootID (/proc/sys/kernel/random/boot_id) tells
	// a reboot, after which both may meet again by chance.
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
	BootID    string `json:"bootId,omitempty"`
	// Hostname and PidNS (the inode of its pid namespace) say where the
	// pid means that process: another host, or another container, never
	// adopts it (host.go).
	Hostname string `json:"hostname,omitempty"`
	PidNS    uint64 `json:"pidNs,omitempty"`
	// PGID is the process group kernelgate signals (the kernel leads it).
	PGID int `json:"pgid"`
	// RuntimeDir is the kernel's private directory (connection file,
	// HOME, work directory), removed with the kernel.
	RuntimeDir string `json:"runtimeDir"`
	// OutputFile is where a detached kernel writes its stdout and
	// stderr; empty for a kernel whose output went through a pipe.
	OutputFile string `json:"outputFile,omitempty"`
	// Cgroups are the kernel's cgroup directories, one per hierarchy.
	Cgroups []CgroupInfo `json:"cgroups,omitempty"`
	// Sandboxed: the process is bubblewrap; interrupts go by message.
	Sandboxed bool `json:"sandboxed,omitempty"`
	// Bridged: the gateway reached the kernel through a network bridge
	// into its sandbox, which lives in the gateway process.
	Bridged bool `json:"bridged,omitempty"`
	// Detached: the kernel was launched not to end with the gateway.
	Detached bool `json:"detached,omitempty"`
	// Lease is the file a gateway renews while it answers for a detached
	// kernel, for OrphanTimeout at a time; its watchdog (pid and start
	// time) stops the kernel once the lease has run out (orphan.go).
	Lease         string        `json:"lease,omitempty"`
	OrphanTimeout time.Duration `json:"orphanTimeout,omitempty"`
	WatchdogPID   int           `json:"watchdogPid,omitempty"`
	WatchdogStart uint64        `json:"watchdogStart,omitempty"`
	// Command is how to start commands beside the kernel once adopted
	// (commandinfo.go); nil in the info of an earlier version, whose
	// kernel then cannot run commands.
	Command *CommandInfo `json:"command,omitempty"`
}

// CgroupInfo is one directory of a kernel's cgroup.
type CgroupInfo struct {
	Dir         string   `json:"dir"`
	V2          bool     `json:"v2,omitempty"`
	Controllers []string `json:"controllers"`
}

// provisionerInfo is li as the info of a kernel reached at ci.
func (li *Info) provisionerInfo(ci jupyter.ConnInfo) (jupyter.ProvisionerInfo, error) {
	data, err := json.Marshal(li)
	if err != nil {
		return jupyter.ProvisionerInfo{}, err
	}
	return jupyter.ProvisionerInfo{Provisioner: InfoName, Connection: ci, Data: data}, nil
}

// InfoOf reads the local kernel info of pi (its Data); it fails with
// jupyter.ErrNotAdoptable for the info of another provisioner's kernel.
func InfoOf(pi jupyter.ProvisionerInfo) (*Info, error) {
	if pi.Provisioner != InfoName && pi.Provisioner != Name {
		return nil, fmt.Errorf("%w: not a local kernel (provisioner %q)", jupyter.ErrNotAdoptable, pi.Provisioner)
	}
	var li Info
	if len(pi.Data) == 0 {
		return nil, fmt.Errorf("%w: a local kernel's info without its process", jupyter.ErrNotAdoptable)
	}
	if err := json.Unmarshal(pi.Data, &li); err != nil {
		return nil, fmt.Errorf("%w: local kernel info: %v", jupyter.ErrNotAdoptable, err)
	}
	return &li, nil
}

// portRetries is how many times a start whose port another process took
// in the meantime is tried.
const portRetries = 3

// RetryStart: a kernel whose ports another process took between their
// choice and its bind is started again, on new ports, up to portRetries
// times in all. The kernel could not bind a port (its output says so), or
// the gateway reached another process's socket there (peerNotKernel).
func (p *Provisioner) RetryStart(_ *kernelspecs.Spec, err error, attempt int) bool {
	if attempt >= portRetries {
		return false
	}
	var died *jupyter.DiedError
	if errors.As(err, &died) && (strings.Contains(died.Output, "Address already in use") || strings.Contains(died.Output, "AddrInUse")) {
		return true
	}
	return peerNotKernel(err)
}

// peerNotKernel reports whether a start failed because what the client
// dialled was not the kernel: a connection ended while the kernel still
// ran (the socket was someone else's, who closed it), a request found
// the connection closed by its peer, or the peer spoke no ZMTP or had
// another socket type.
func peerNotKernel(err error) bool {
	var died *jupyter.DiedError
	if errors.As(err, &died) && died.Lost != "" {
		return true
	}
	if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
		return true
	}
	return errors.Is(err, jupyter.ErrHandshake)
}

// RemoveLeftovers removes what a kept local kernel that is gone left
// behind (its directory and its watchdog), and reports whether it was
// gone. A kernel that still runs, or one whose sandbox was reached
// through a bridge of the gateway, is left alone.
func (p *Provisioner) RemoveLeftovers(info jupyter.ProvisionerInfo) bool {
	li, err := InfoOf(info)
	if err != nil || li.Bridged || li.elsewhere() != nil || sameProcess(li) {
		return false // a kernel of another host is left to its host
	}
	stopWatchdog(li.WatchdogPID, li.WatchdogStart)
	os.RemoveAll(li.RuntimeDir)
	return true
}

// sameProcess reports whether the process li names still runs.
func sameProcess(li *Info) bool {
	if li.elsewhere() != nil || li.BootID != "" && li.BootID != bootID() {
		return false
	}
	start, err := processStart(li.PID)
	return err == nil && start == li.StartTime
}

var (
	_ jupyter.StartRetrier    = (*Provisioner)(nil)
	_ jupyter.LeftoverRemover = (*Provisioner)(nil)
	_ jupyter.Adopter         = (*Provisioner)(nil)
)

// interruptsByMessage says whether p asks for message interrupts.
func interruptsByMessage(p jupyter.Process) bool {
	m, ok := p.(messageInterrupter)
	return ok && m.InterruptByMessage()
}

// Interrupt, Terminate and Kill of the three kinds of local kernel
// process: SIGINT, SIGTERM and SIGKILL to the kernel's process group. A
// sandboxed kernel is interrupted by message: SIGINT to bwrap would end
// the sandbox (and Windows has no SIGINT to send).

func (lp *localProcess) Interrupt() error {
	if lp.InterruptByMessage() {
		return jupyter.ErrInterruptByMessage
	}
	return lp.Signal(syscall.SIGINT)
}
func (lp *localProcess) Terminate() error { return lp.Signal(syscall.SIGTERM) }
func (lp *localProcess) Kill() error      { return lp.Signal(syscall.SIGKILL) }

func (ap *adoptedProcess) Interrupt() error {
	if ap.InterruptByMessage() {
		return jupyter.ErrInterruptByMessage
	}
	return ap.Signal(syscall.SIGINT)
}
func (ap *adoptedProcess) Terminate() error { return ap.Signal(syscall.SIGTERM) }
func (ap *adoptedProcess) Kill() error      { return ap.Signal(syscall.SIGKILL) }

// ExitReason: nothing is known of how a process that was not a child
// ended beyond its end.
func (ap *adoptedProcess) ExitReason() string { return "" }

var (
	_ jupyter.LocalProcess = (*localProcess)(nil)
	_ jupyter.LocalProcess = (*adoptedProcess)(nil)
)

package jupyter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ProvisionerInfo is what a provisioner needs to reach and control a
// kernel it launched once the client that started it is gone: after a
// restart of the gateway it is loaded back (jupyter_client's
// get_provisioner_info and load_provisioner_info). It holds the
// connection info with its key: keep it as secret as the key.
type ProvisionerInfo struct {
	// Provisioner names the provisioner that launched the kernel
	// ("local").
	Provisioner string   `json:"provisioner"`
	Connection  ConnInfo `json:"connection"`
	// Local is set for a kernel of the local provisioner.
	Local *LocalInfo `json:"local,omitempty"`
	// Data is what another provisioner keeps of the kernel (for
	// kubernetes-provisioner: its pod), in its own format.
	Data json.RawMessage `json:"data,omitempty"`
}

// LocalInfo is how a local kernel process is found and controlled again.
type LocalInfo struct {
	// PID and StartTime (field 22 of /proc/<pid>/stat, in clock ticks
	// since boot) name the process: a pid reused by another process has
	// another start time. BootID (/proc/sys/kernel/random/boot_id) tells
	// a reboot, after which both may meet again by chance.
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
	BootID    string `json:"bootId,omitempty"`
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
}

// CgroupInfo is one directory of a kernel's cgroup.
type CgroupInfo struct {
	Dir         string   `json:"dir"`
	V2          bool     `json:"v2,omitempty"`
	Controllers []string `json:"controllers"`
}

// Marshal encodes the info for a store.
func (pi ProvisionerInfo) Marshal() ([]byte, error) { return json.Marshal(pi) }

// UnmarshalProvisionerInfo decodes what Marshal wrote.
func UnmarshalProvisionerInfo(b []byte) (ProvisionerInfo, error) {
	var pi ProvisionerInfo
	if err := json.Unmarshal(b, &pi); err != nil {
		return pi, fmt.Errorf("jupyter: provisioner info: %w", err)
	}
	if pi.Provisioner == "" {
		return pi, errors.New("jupyter: provisioner info names no provisioner")
	}
	return pi, nil
}

// InfoProcess is a Process that can say how to reach it again.
type InfoProcess interface {
	Process
	ProvisionerInfo() (ProvisionerInfo, error)
}

// Adopter is a Provisioner that takes over a kernel it launched before,
// perhaps in another process, from its ProvisionerInfo. Adopt fails with
// ErrNotAdoptable, without touching any process, unless it is sure the
// process is the kernel the info names.
type Adopter interface {
	Adopt(ctx context.Context, info ProvisionerInfo) (Process, error)
}

// Releaser is a Process that the gateway can stop watching without
// stopping the kernel (Kernel.Detach).
type Releaser interface {
	Release()
}

// ErrNotAdoptable: the process a ProvisionerInfo names is gone, is
// another process now, or cannot be controlled from here.
var ErrNotAdoptable = errors.New("jupyter: kernel cannot be adopted")

// ErrKernelDetached: the client was closed and the kernel left running.
var ErrKernelDetached = errors.New("jupyter: kernel client detached")

// ProvisionerInfo returns the kernel's provisioner info, when its process
// can give one.
func (k *Kernel) ProvisionerInfo() (ProvisionerInfo, error) {
	ip, ok := k.proc.(InfoProcess)
	if !ok {
		return ProvisionerInfo{}, fmt.Errorf("%w: its provisioner keeps no info", ErrNotAdoptable)
	}
	return ip.ProvisionerInfo()
}

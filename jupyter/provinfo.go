package jupyter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// ProvisionerInfo is what a provisioner needs to reach and control a
// kernel it launched once the client that started it is gone: after a
// restart of the gateway it is loaded back (jupyter_client's
// get_provisioner_info and load_provisioner_info). It holds the
// connection info with its key: keep it as secret as the key.
type ProvisionerInfo struct {
	// Provisioner names the provisioner that launched the kernel.
	Provisioner string   `json:"provisioner"`
	Connection  ConnInfo `json:"connection"`
	// Data is what the provisioner keeps of the kernel (the local one:
	// its process and directory; kubernetes-provisioner: its pod), in its
	// own format.
	Data json.RawMessage `json:"data,omitempty"`
}

// Marshal encodes the info for a store.
func (pi ProvisionerInfo) Marshal() ([]byte, error) { return json.Marshal(pi) }

// UnmarshalProvisionerInfo decodes what Marshal wrote. Info written by
// earlier versions kept a provisioner's data under a key named as the
// provisioner ("local") rather than under "data": that is read as its
// Data, so kernels kept before an upgrade are adopted after it.
func UnmarshalProvisionerInfo(b []byte) (ProvisionerInfo, error) {
	var pi ProvisionerInfo
	if err := json.Unmarshal(b, &pi); err != nil {
		return pi, fmt.Errorf("jupyter: provisioner info: %w", err)
	}
	if pi.Provisioner == "" {
		return pi, errors.New("jupyter: provisioner info names no provisioner")
	}
	if len(pi.Data) == 0 {
		var all map[string]json.RawMessage
		if json.Unmarshal(b, &all) == nil {
			if d := all[pi.Provisioner]; len(d) > 0 && string(d) != "null" {
				pi.Data = d
			}
		}
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

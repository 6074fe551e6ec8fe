package jupyter

import "errors"

// ErrElsewhere: the kernel runs on another host than this process's
// (ErrNotAdoptable too): only a gateway on its host may adopt it.
var ErrElsewhere = errors.New("jupyter: the kernel runs on another host")

// Locator is a Provisioner that tells, from a kernel's info alone and
// without touching any process, whether the kernel runs where this
// process could adopt it: nil, or an error wrapping ErrElsewhere and
// ErrNotAdoptable that names the host.
type Locator interface {
	Locate(info ProvisionerInfo) error
}

// Locate asks the provisioner that launched the kernel where it runs;
// nil when that provisioner does not say (or is not configured: Adopt
// then says why).
func (r *Registry) Locate(info ProvisionerInfo) error {
	p, ok := r.infoProvisioner(info)
	if !ok {
		return nil
	}
	if l, ok := p.(Locator); ok {
		return l.Locate(info)
	}
	return nil
}

var _ Locator = (*Registry)(nil)

package local

import (
	"fmt"
	"os"
	"sync"

	"kernelgate/jupyter"
)

// A local kernel is adopted again by its pid, which names a process only
// on the host (and in the pid namespace) it was read on: on another host
// the same pid, even with the same start time, may be any process. Its
// info therefore carries its host: the machine's boot id, its hostname
// and the pid namespace's inode; a gateway elsewhere leaves the kernel
// alone (Locate), and Adopt refuses it.

// host is where a process runs.
type host struct {
	name  string
	pidNS uint64
}

// thisHost is where this process runs.
var thisHost = sync.OnceValue(func() host {
	name, _ := os.Hostname()
	return host{name: name, pidNS: pidNamespace()}
})

// elsewhere returns an error wrapping jupyter.ErrElsewhere when li's
// kernel runs on another host, or in another pid namespace, than this
// process; nil when it runs here, or when li is of a version that did
// not record its host (the boot id alone then decides).
func (li *Info) elsewhere() error {
	here := thisHost()
	switch {
	case li.Hostname != "" && li.Hostname != here.name:
		return fmt.Errorf("%w: %w: it runs on host %q, this gateway on %q: only a gateway on its host adopts it by its pid",
			jupyter.ErrNotAdoptable, jupyter.ErrElsewhere, li.Hostname, here.name)
	case li.PidNS != 0 && here.pidNS != 0 && li.PidNS != here.pidNS:
		return fmt.Errorf("%w: %w: it runs in another pid namespace (another container) on host %q: only a gateway beside it adopts it by its pid",
			jupyter.ErrNotAdoptable, jupyter.ErrElsewhere, li.Hostname)
	}
	return nil
}

// Locate implements jupyter.Locator: an error wrapping
// jupyter.ErrElsewhere when the kernel info names runs on another host.
func (p *Provisioner) Locate(info jupyter.ProvisionerInfo) error {
	li, err := InfoOf(info)
	if err != nil {
		return nil // not a local kernel's: Adopt says why
	}
	return li.elsewhere()
}

var _ jupyter.Locator = (*Provisioner)(nil)

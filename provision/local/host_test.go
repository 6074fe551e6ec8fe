//go:build linux

package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"kernelgate/jupyter"
)

// TestAdoptLeavesKernelsOfAnotherHost: a local kernel's info names its
// host; info naming another host (or another pid namespace) is never
// adopted by its pid, even when a process here has that pid, start time
// and boot: Locate and Adopt say it runs elsewhere, and nothing of it
// (its directory) is removed as a leftover. The info of a kernel of this
// host is located here.
func TestAdoptLeavesKernelsOfAnotherHost(t *testing.T) {
	self, err := processStart(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "kernel")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := &Provisioner{}
	here := thisHost()
	li := &Info{PID: os.Getpid(), PGID: os.Getpid(), StartTime: self, BootID: bootID(), RuntimeDir: dir,
		Hostname: here.name, PidNS: here.pidNS}
	if err := p.Locate(withLocal(t, jupyter.ProvisionerInfo{Provisioner: InfoName}, li)); err != nil {
		t.Errorf("a kernel of this host: Locate says %v, want nil", err)
	}
	for name, other := range map[string]func(*Info){
		"another host":          func(li *Info) { li.Hostname = "another-" + here.name },
		"another pid namespace": func(li *Info) { li.PidNS = here.pidNS + 1 },
	} {
		o := *li
		other(&o)
		info := withLocal(t, jupyter.ProvisionerInfo{Provisioner: InfoName}, &o)
		if err := p.Locate(info); !errors.Is(err, jupyter.ErrElsewhere) {
			t.Errorf("%s: Locate says %v, want ErrElsewhere", name, err)
		}
		proc, err := p.Adopt(context.Background(), info)
		if !errors.Is(err, jupyter.ErrElsewhere) || !errors.Is(err, jupyter.ErrNotAdoptable) {
			t.Errorf("%s: Adopt gives %v, %v; want ErrElsewhere (a pid of another host is any process here)", name, proc, err)
		}
		if proc != nil {
			if r, ok := proc.(jupyter.Releaser); ok {
				r.Release()
			}
		}
		if p.RemoveLeftovers(info) {
			t.Errorf("%s: its directory was removed as a leftover", name)
		}
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("%s: the kernel's directory: %v", name, err)
		}
	}
}

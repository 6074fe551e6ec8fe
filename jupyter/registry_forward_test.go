package jupyter

import (
	"context"
	"errors"
	"testing"

	"kernelgate/kernelspecs"
)

// retryingProv retries every start until attempt 3, removes the
// leftovers of any kernel, and adopts none.
type retryingProv struct {
	namedProv
	removed []string
	adopted []string
}

func (p *retryingProv) RetryStart(_ *kernelspecs.Spec, _ error, attempt int) bool { return attempt < 3 }

func (p *retryingProv) RemoveLeftovers(info ProvisionerInfo) bool {
	p.removed = append(p.removed, info.Provisioner)
	return true
}

func (p *retryingProv) Adopt(_ context.Context, info ProvisionerInfo) (Process, error) {
	p.adopted = append(p.adopted, info.Provisioner)
	return nil, ErrNotAdoptable
}

// The Registry hands what differs between provisioners to the one that
// launched the kernel: whether a failed start is retried to the
// provisioner of its kernelspec, leftovers and adoption to the one the
// info names, by its name or by an alias (the name an earlier version's
// info gives it). Stop of a kernel that is gone removes its leftovers.
func TestRegistryForwardsToTheKernelsProvisioner(t *testing.T) {
	retrying := &retryingProv{namedProv: namedProv{name: "retrying", caps: Capabilities{Reconnect: true}}}
	plain := &namedProv{name: "plain"}
	r := NewRegistry("retrying")
	r.Register("retrying", retrying)
	r.Register("plain", plain)
	r.Alias("old", "retrying")
	spec := &kernelspecs.Spec{Name: "python3"}
	plainSpec := &kernelspecs.Spec{Name: "p", Metadata: map[string]any{"kernel_provisioner": map[string]any{"provisioner_name": "plain"}}}
	died := &DiedError{Output: "Address already in use"}

	if !r.RetryStart(spec, died, 1) || r.RetryStart(spec, died, 3) {
		t.Error("RetryStart is not the spec's provisioner's")
	}
	if r.RetryStart(plainSpec, died, 1) {
		t.Error("a provisioner that retries nothing had a start retried")
	}
	if err := Stop(context.Background(), r, ProvisionerInfo{Provisioner: "old"}, 0); err != nil {
		t.Errorf("Stop of a gone kernel: %v, want its leftovers removed", err)
	}
	if len(retrying.adopted) != 1 || len(retrying.removed) != 1 {
		t.Errorf("adopted %v, removed %v: the alias does not reach its provisioner", retrying.adopted, retrying.removed)
	}
	if r.RemoveLeftovers(ProvisionerInfo{Provisioner: "plain"}) || r.RemoveLeftovers(ProvisionerInfo{Provisioner: "none"}) {
		t.Error("leftovers removed by a provisioner that cannot")
	}
	if _, err := r.Adopt(context.Background(), ProvisionerInfo{Provisioner: "none"}); !errors.Is(err, ErrNotAdoptable) {
		t.Errorf("adopt by an unknown provisioner: %v", err)
	}
	for _, n := range r.Names() {
		if n == "old" {
			t.Error("Names lists an alias")
		}
	}
}

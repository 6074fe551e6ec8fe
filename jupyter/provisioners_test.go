package jupyter

import (
	"context"
	"errors"
	"testing"

	"kernelgate/kernelspecs"
)

type namedProv struct {
	name string
	caps Capabilities
}

func (p *namedProv) Launch(context.Context, LaunchRequest) (Process, error) {
	return nil, errors.New("launched by " + p.name)
}
func (p *namedProv) Capabilities(*kernelspecs.Spec) Capabilities { return p.caps }

// A kernelspec names its provisioner in metadata.kernel_provisioner, as
// jupyter_client reads it; one that names none gets the default; one that
// names a provisioner the gateway lacks fails to start, saying which.
func TestRegistry(t *testing.T) {
	const localName, kubeName = "local-provisioner", "kubernetes-provisioner"
	r := NewRegistry(localName)
	local := &namedProv{name: "local", caps: Capabilities{SignalInterrupts: true}}
	k8s := &namedProv{name: "k8s", caps: Capabilities{Reconnect: false}}
	r.Register(localName, local)
	r.Register(kubeName, k8s)
	plain := &kernelspecs.Spec{Name: "python3"}
	pod := &kernelspecs.Spec{Name: "pod", Metadata: map[string]any{"kernel_provisioner": map[string]any{
		"provisioner_name": "kubernetes-provisioner", "config": map[string]any{"image": "x"}}}}
	other := &kernelspecs.Spec{Name: "other", Metadata: map[string]any{"kernel_provisioner": map[string]any{"provisioner_name": "docker-provisioner"}}}
	bad := &kernelspecs.Spec{Name: "bad", Metadata: map[string]any{"kernel_provisioner": map[string]any{"config": map[string]any{}}}}

	if _, err := r.Launch(context.Background(), LaunchRequest{Spec: plain}); err == nil || err.Error() != "launched by local" {
		t.Errorf("plain spec: %v", err)
	}
	if _, err := r.Launch(context.Background(), LaunchRequest{Spec: pod}); err == nil || err.Error() != "launched by k8s" {
		t.Errorf("pod spec: %v", err)
	}
	if !r.Capabilities(plain).SignalInterrupts || r.Capabilities(pod).SignalInterrupts {
		t.Errorf("capabilities are not the chosen provisioner's: %+v %+v", r.Capabilities(plain), r.Capabilities(pod))
	}
	_, err := r.Launch(context.Background(), LaunchRequest{Spec: other})
	if !errors.Is(err, ErrStartFailed) || !errors.Is(err, ErrNoProvisioner) {
		t.Errorf("unknown provisioner: %v", err)
	}
	if _, err := r.Launch(context.Background(), LaunchRequest{Spec: bad}); !errors.Is(err, ErrStartFailed) {
		t.Errorf("no provisioner_name: %v", err)
	}
	c, err := ChoiceOf(pod)
	if err != nil || c.Name != kubeName || string(c.Config) != `{"image":"x"}` {
		t.Errorf("ChoiceOf = %+v, %v", c, err)
	}

	r2 := NewRegistry(kubeName)
	r2.Register(localName, local)
	r2.Register(kubeName, k8s)
	if _, err := r2.Launch(context.Background(), LaunchRequest{Spec: plain}); err == nil || err.Error() != "launched by k8s" {
		t.Errorf("default kubernetes: %v", err)
	}
	if _, err := r2.Adopt(context.Background(), ProvisionerInfo{Provisioner: kubeName}); !errors.Is(err, ErrNotAdoptable) {
		t.Errorf("adopt by a provisioner that cannot: %v", err)
	}
}

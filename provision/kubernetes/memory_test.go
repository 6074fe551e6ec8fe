package kubernetes

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"kernelgate/jupyter"
)

// memoryOptions are launch options that bound the kernel's memory, as
// the local provisioner's are (the gateway's --kernel-memory).
type memoryOptions int64

func (m memoryOptions) MemoryLimit() int64 { return int64(m) }

// The memory limit a launch's options carry becomes the pod's memory
// limit; options without one leave the pod without.
func TestLaunchMemoryLimitReachesThePod(t *testing.T) {
	for _, c := range []struct {
		name    string
		options any
		want    int64
	}{{"memory option", memoryOptions(512 << 20), 512 << 20}, {"other options", struct{}{}, 0}} {
		t.Run(c.name, func(t *testing.T) {
			client := fake.NewClientset()
			p := startProvisioner(t, client)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			// No kubelet plays the pod: the launch waits for it to run
			// until ctx ends.
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				p.Launch(ctx, jupyter.LaunchRequest{KernelID: "0d7a1a0e-1111-4222-8333-444455556666", Spec: testSpec(), Kind: "jupyter", Options: c.options})
			}()
			pod := createdPod(t, client)
			cancel()
			<-ended
			got := pod.Spec.Containers[0].Resources.Limits.Memory().Value()
			if got != c.want {
				t.Errorf("pod memory limit %d, want %d", got, c.want)
			}
		})
	}
}

package kubernetes

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"kernelgate/jupyter"
)

// A sweep may run at any time (every replica sweeps periodically): it
// leaves the Secret and the pod of a kernel this provisioner is starting,
// even when no replica is said to own the kernel; once the start gives
// up, they go.
func TestSweepLeavesWhatItStarts(t *testing.T) {
	client := fake.NewClientset()
	p := startProvisioner(t, client)
	p.Owned = func(context.Context, string) (bool, error) { return false, nil }
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ended := make(chan error, 1)
	go func() {
		_, err := p.Launch(ctx, jupyter.LaunchRequest{KernelID: "0d7a1a0e-1111-4222-8333-444455556666", Spec: testSpec(), Kind: "context"})
		ended <- err
	}()
	pod := createdPod(t, client)
	// The informer has the pod (no kubelet runs it: the start waits).
	cached, _ := p.cachedPods()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := cached.Get(pod.Name); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the informer never had the pod")
		}
		<-tick.C
	}
	exists := func() (pods, secrets int) {
		pl, _ := client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		sl, _ := client.CoreV1().Secrets(ns).List(context.Background(), metav1.ListOptions{})
		return len(pl.Items), len(sl.Items)
	}
	if n, err := p.Sweep(context.Background(), nil); err != nil || n != 0 {
		t.Errorf("a sweep while the pod starts: %d deleted, %v", n, err)
	}
	if pods, secrets := exists(); pods != 1 || secrets != 1 {
		t.Errorf("after a sweep during the start: %d pods and %d Secrets, want 1 and 1", pods, secrets)
	}
	cancel()
	if err := <-ended; err == nil {
		t.Fatal("the launch of a pod no kubelet runs succeeded")
	}
	if pods, secrets := exists(); pods != 0 || secrets != 0 {
		t.Errorf("after the start gave up: %d pods and %d Secrets, want none", pods, secrets)
	}
}

//go:build linux

package kubernetes

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"kernelgate/internal/k8stest"
	"kernelgate/internal/pgtest"
	"kernelgate/internal/testkernels"
	"kernelgate/jupyter"
	"kernelgate/state"
)

// TestSweepLeavesOtherReplicasPods: on a real control plane, live
// replica a runs two kernel pods, one of a kernel whose lease it holds
// and one with no lease (a warm-pool kernel, or one whose lease is not
// taken yet), and replica c, which is not live, left one with no owner;
// replica b starting on the same release and database sweeps with
// Owned from the leases (LeaseClaimed) and LiveReplica from the
// replicas table: a's pods and Secrets stay (their kernels running),
// the orphan's go.
func TestSweepLeavesOtherReplicasPods(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("sweep")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	open := func(id string) *state.Postgres {
		s, err := state.OpenPostgres(ctx, url, state.PostgresOptions{Replica: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	storeA, storeB := open("a"), open("b")
	if err := storeA.JoinReplicas(ctx, "http://a:8888"); err != nil {
		t.Fatal(err)
	}

	cp := k8stest.Start(t)
	k8stest.StartNode(t, cp, k8stest.NodeConfig{Images: map[string]k8stest.Image{testImage: {}}})
	cp.CreateNamespace(t, ns)
	role := deployRole(t)
	role.Namespace = ns
	cfg := cp.ServiceAccount(t, ns, "kernelgate", role)
	provisioner := func(s *state.Postgres) *Provisioner {
		p := &Provisioner{Client: k8s.NewForConfigOrDie(cfg), Config: cfg, Namespace: ns, Release: "replicas",
			Replica: s.Replica(),
			Owned:   func(ctx context.Context, id string) (bool, error) { return s.LeaseClaimed(ctx, id, 20*time.Second) },
			LiveReplica: func(ctx context.Context, id string) (bool, error) {
				live, err := s.LiveReplicas(ctx, time.Minute)
				return slices.ContainsFunc(live, func(r state.Replica) bool { return r.ID == id }), err
			}}
		if err := p.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Stop)
		return p
	}
	a := provisioner(storeA)
	spec := *testkernels.Spec(t, "python3")
	spec.Metadata = map[string]any{"kernel_provisioner": map[string]any{
		"provisioner_name": "kubernetes-provisioner",
		"config":           map[string]any{"image": testImage, "command": []string{os.Args[0], "kernel-entry"}},
	}}
	const (
		owned    = "0b7e2c4a-1d3f-4e5a-9b6c-7d8e9f0a1b2c"
		unleased = "5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a"
		orphan   = "9c8d7e6f-5a4b-4c3d-8e2f-1a0b9c8d7e6f"
	)
	c := provisioner(open("c")) // never joined: not live
	launch := func(by *Provisioner, id string) *podProcess {
		proc, err := by.Launch(ctx, jupyter.LaunchRequest{KernelID: id, Spec: &spec, Kind: "context"})
		if err != nil {
			t.Fatal(err)
		}
		pp := proc.(*podProcess)
		t.Cleanup(func() { pp.Cleanup() })
		return pp
	}
	if _, err := storeA.AcquireLease(ctx, owned, time.Minute); err != nil {
		t.Fatal(err)
	}
	ownedProc := launch(a, owned)
	unleasedProc := launch(a, unleased)
	orphanProc := launch(c, orphan)

	b := provisioner(storeB)
	n, err := b.Sweep(ctx, nil)
	if err != nil || n != 1 {
		t.Fatalf("b's sweep: %d pods deleted, %v; want 1 (the orphan)", n, err)
	}
	exists := func(id string) (pod, secret bool) {
		sel := metav1.ListOptions{LabelSelector: LabelKernelID + "=" + id}
		pods, err := cp.Client.CoreV1().Pods(ns).List(ctx, sel)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			pod = pod || p.DeletionTimestamp == nil
		}
		secrets, err := cp.Client.CoreV1().Secrets(ns).List(ctx, sel)
		if err != nil {
			t.Fatal(err)
		}
		return pod, len(secrets.Items) > 0
	}
	for _, k := range []struct {
		id   string
		proc *podProcess
		what string
	}{{owned, ownedProc, "a kernel whose lease a holds"}, {unleased, unleasedProc, "a kernel live replica a runs with no lease"}} {
		if pod, secret := exists(k.id); !pod || !secret {
			t.Errorf("the pod of %s: pod %v, Secret %v after b's sweep; want both kept", k.what, pod, secret)
		}
		select {
		case <-k.proc.Done():
			t.Errorf("the process of %s ended after b's sweep", k.what)
		default:
		}
	}
	select {
	case <-orphanProc.Done():
	case <-ctx.Done():
		t.Fatal("the orphan's process did not end after b's sweep")
	}
	if pod, secret := exists(orphan); pod || secret {
		t.Errorf("the orphan: pod %v, Secret %v after b's sweep; want both deleted", pod, secret)
	}
}

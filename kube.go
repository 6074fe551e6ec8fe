package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
	kubeprov "kernelgate/provision/kubernetes"
	"kernelgate/sessions"
	"kernelgate/state"
)

// startKubernetes registers kubernetes-provisioner when it is the default
// or a kernelspec names it, and starts it; nil when neither.
// Kernel pods mount their context's folder of --kernel-workspace-claim,
// mounted at workspaceRoot (the real path of --workspace-root).
func startKubernetes(cfg *config, specs *kernelspecs.Catalog, reg *jupyter.Registry, workspaceRoot string, log *slog.Logger) (*kubeprov.Provisioner, error) {
	needed := cfg.DefaultProvisioner == kubeprov.Name
	for _, s := range specs.All() {
		if name, err := reg.NameFor(s); err == nil && name == kubeprov.Name {
			needed = true
		}
	}
	if !needed {
		return nil, nil
	}
	// client-go logs through klog: send it to the gateway's log, in its
	// format, rather than to stderr on its own.
	klog.SetSlogLogger(log.With("component", "client-go"))
	rc, ns, err := kubeConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes-provisioner: %w", err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes-provisioner: %w", err)
	}
	p := &kubeprov.Provisioner{Client: client, Config: rc, Namespace: ns, Release: cfg.Release, Logger: log}
	if cfg.KernelWorkspaceClaim != "" {
		p.WorkspaceClaim, p.WorkspaceRoot = cfg.KernelWorkspaceClaim, workspaceRoot
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		return nil, err
	}
	reg.Register(kubeprov.Name, p)
	log.Info("kubernetes-provisioner", "namespace", ns, "release", cfg.Release, "server", rc.Host, "workspace_claim", p.WorkspaceClaim)
	return p, nil
}

// kubeConfig is the client config of --kubeconfig, or the pod's own
// service account in a cluster, and the namespace of the kernel pods.
func kubeConfig(cfg *config) (*rest.Config, string, error) {
	if cfg.Kubeconfig == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, "", fmt.Errorf("no --kubeconfig and not running in a cluster: %w", err)
		}
		ns := cfg.KubeNamespace
		if ns == "" {
			b, err := readFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
			if err != nil {
				return nil, "", fmt.Errorf("--kubernetes-namespace not set and the pod's namespace unknown: %w", err)
			}
			ns = b
		}
		return rc, ns, nil
	}
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: cfg.Kubeconfig}, &clientcmd.ConfigOverrides{})
	rc, err := loader.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("--kubeconfig: %w", err)
	}
	ns := cfg.KubeNamespace
	if ns == "" {
		if ns, _, err = loader.Namespace(); err != nil {
			return nil, "", fmt.Errorf("--kubeconfig: %w", err)
		}
	}
	return rc, ns, nil
}

// podOwners is what adoptPods asks of the store: the kernels it has a
// record of, whose adoption is the store's (Restore at start, failover
// later), and, with replicas, who holds a kernel's lease.
type podOwners struct {
	store state.Store // nil: no records
	// holder is the id of the replica holding the kernel's lease, "" when
	// none does; nil for a single gateway.
	holder func(ctx context.Context, kernel string) (string, error)
	self   string // this replica's id
}

// leaseHolder is podOwners.holder of a replica's store.
func leaseHolder(pg *state.Postgres) func(context.Context, string) (string, error) {
	return func(ctx context.Context, kernel string) (string, error) {
		l, err := pg.LeaseOwner(ctx, kernel)
		if errors.Is(err, state.ErrNoLease) {
			return "", nil
		}
		return l.Owner, err
	}
}

// adoptPods serves again the Jupyter kernels whose pods run in the
// release and that no store record and no other replica accounts for,
// found from the API server alone, and deletes the kernel pods no
// gateway serves (those of contexts and warm pools, whose state a
// restart loses, and those that could not be adopted). A kernel with a
// record is the store's to restore: Restore took those whose lease this
// replica acquired, the failover scan takes the others once their lease
// is free. A pod whose lease another replica holds is that replica's; the
// others are adopted under a lease this replica acquires first
// (sessions.Manager.AdoptRunning), so two replicas never adopt one pod.
func adoptPods(ctx context.Context, p *kubeprov.Provisioner, mgr *sessions.Manager, o podOwners, log *slog.Logger) error {
	found, err := p.List(ctx)
	if err != nil {
		return err
	}
	recorded := map[string]bool{}
	if o.store != nil {
		snap, err := o.store.Load(ctx)
		if err != nil {
			return fmt.Errorf("kernel pods: %w", err)
		}
		for _, k := range snap.Kernels {
			recorded[k.ID] = true
		}
	}
	keep := map[string]bool{}
	adopted, theirs := 0, 0
	for _, f := range found {
		if _, err := mgr.Kernel(f.KernelID); err == nil {
			keep[f.KernelID] = true // restored from the store
			continue
		}
		if f.Kind != "jupyter" || recorded[f.KernelID] {
			continue
		}
		if o.holder != nil {
			by, err := o.holder(ctx, f.KernelID)
			if err != nil {
				log.Warn("kernel pod not adopted: who holds its lease is unknown", "kernel", f.KernelID, "err", err)
				continue
			}
			if by != "" && by != o.self {
				theirs++
				log.Debug("kernel pod left to the replica that holds its lease", "kernel", f.KernelID, "replica", by)
				continue
			}
		}
		if _, err := mgr.AdoptRunning(ctx, f.KernelID, f.Spec, f.Env, f.Info); err != nil {
			log.Warn("kernel pod not adopted", "kernel", f.KernelID, "err", err)
			continue
		}
		keep[f.KernelID] = true
		adopted++
	}
	n, err := p.Sweep(ctx, keep)
	if err != nil {
		return err
	}
	log.Info("kernel pods", "adopted", adopted, "other_replicas", theirs, "deleted", n)
	return nil
}

// podSweepLeases is how many leases apart the replicas sweep the
// release's kernel pods.
const podSweepLeases = 3

// sweepPods deletes, every period until stopped, the release's kernel
// pods that no live replica owns, may adopt or is creating (Sweep, with
// Owned and LiveReplica set): those of kernels whose owner died and that
// no replica adopted within the grace, of a dead replica's warm pool, and
// those found at no start. The returned stop ends it and waits for it.
func sweepPods(p *kubeprov.Provisioner, mgr *sessions.Manager, period time.Duration, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			keep := map[string]bool{}
			for _, k := range mgr.Kernels() {
				keep[k.ID()] = true
			}
			n, err := p.Sweep(ctx, keep)
			switch {
			case err != nil && ctx.Err() == nil:
				log.Warn("kernel pods not swept", "err", err)
			case n > 0:
				log.Info("deleted kernel pods no replica serves", "deleted", n)
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
}

func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

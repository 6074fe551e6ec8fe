package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
	kubeprov "kernelgate/provision/kubernetes"
	"kernelgate/sessions"
)

// startKubernetes registers kubernetes-provisioner when it is the default
// or a kernelspec names it, and starts it; nil when neither.
func startKubernetes(cfg *config, specs *kernelspecs.Catalog, reg *jupyter.Registry, log *slog.Logger) (*kubeprov.Provisioner, error) {
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		return nil, err
	}
	reg.Register(kubeprov.Name, p)
	log.Info("kubernetes-provisioner", "namespace", ns, "release", cfg.Release, "server", rc.Host)
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

// adoptPods serves again the Jupyter kernels whose pods run in the
// release, found from the API server alone, and deletes the kernel pods
// no gateway serves (those of contexts and warm pools, whose state a
// restart loses, and those that could not be adopted).
func adoptPods(ctx context.Context, p *kubeprov.Provisioner, mgr *sessions.Manager, log *slog.Logger) error {
	found, err := p.List(ctx)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, f := range found {
		if f.Kind != "jupyter" {
			continue
		}
		if _, err := mgr.AdoptRunning(ctx, f.KernelID, f.Spec, f.Env, f.Info); err != nil {
			log.Warn("kernel pod not adopted", "kernel", f.KernelID, "err", err)
			continue
		}
		keep[f.KernelID] = true
	}
	n, err := p.Sweep(ctx, keep)
	if err != nil {
		return err
	}
	log.Info("kernel pods", "adopted", len(keep), "deleted", n)
	return nil
}

func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

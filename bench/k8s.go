//go:build linux

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"kernelgate/internal/k8stest"
)

// benchK8s measures kubernetes-provisioner on the test control plane
// (internal/k8stest: a real kube-apiserver and etcd, and a node whose pods
// are local processes), against local kernels of the same kernelgate:
// start → ready of a kernel pod (POST /api/kernels → kernel_info_reply
// over the websocket), and an isolated `1+1` from a warm pod. Without the
// control plane's binaries (make k8s-binaries) the section is skipped.
func (b *bench) benchK8s(ctx context.Context) (err error) {
	tb := &benchTB{}
	defer func() {
		for i := len(tb.cleanups) - 1; i >= 0; i-- {
			tb.cleanups[i]()
		}
		if r := recover(); r != nil {
			if r != errTBStop {
				panic(r)
			}
			if tb.skipped {
				progress("k8s skipped: %s", tb.msg)
				err = nil
				return
			}
			err = errors.New(tb.msg)
		}
	}()
	progress("starting the control plane and the test node")
	cp := k8stest.Start(tb)
	images := map[string]k8stest.Image{}
	for _, k := range kernels {
		images["kernelgate/bench-"+k.spec+":1"] = k8stest.Image{}
	}
	k8stest.StartNode(tb, cp, k8stest.NodeConfig{Images: images})
	cp.CreateNamespace(tb, "bench")
	dir, err := os.MkdirTemp("", "kgbench-k8s-")
	if err != nil {
		return err
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	specs, kubeconfig, err := podKernelspecs(dir, cp)
	if err != nil {
		return err
	}
	local := specDir
	specDir = specs // the pods' kernelspecs, under the same names
	pods, err := startKernelgate(ctx, "kernelgate (pods)", kernelgateBin, "--kubeconfig", kubeconfig,
		"--kubernetes-namespace", "bench", "--release", "bench", "--pool-size", "1", "--pool-prewarm", "python,javascript")
	specDir = local
	if err != nil {
		return err
	}
	defer pods.stop()

	for _, k := range kernels {
		var pod, loc, podRun, locRun sample
		startReady := func(s *server, out *sample) func() error {
			return func() error {
				d, err := startToReady(ctx, s, k.spec, true)
				if err == nil {
					*out = append(*out, d)
				}
				return err
			}
		}
		isolated := func(s *server, out *sample) func() error {
			return func() error {
				sctx, cancel := within(ctx, 2*time.Minute)
				defer cancel()
				if err := s.waitPool(sctx, k.spec, 1); err != nil {
					return err
				}
				before, err := s.kernelCount(sctx)
				if err != nil {
					return err
				}
				d, err := measure(func() error {
					_, err := s.execute(sctx, map[string]any{"code": "1+1", "language": k.language, "isolated": true}, "2")
					return err
				})
				if err != nil {
					return err
				}
				*out = append(*out, d)
				return s.waitKernels(sctx, before)
			}
		}
		steps := []func() error{startReady(pods, &pod), startReady(b.kgOff, &loc)}
		if err := b.interleave("start → ready, pod and local, "+k.spec, steps, func() { pod, loc = nil, nil }, b.opt.starts); err != nil {
			return err
		}
		steps = []func() error{isolated(pods, &podRun), isolated(b.kg, &locRun)}
		if err := b.interleave("isolated run from a warm pod and a warm local kernel, "+k.spec, steps, func() { podRun, locRun = nil, nil }, b.opt.poolRuns); err != nil {
			return err
		}
		b.add(row{figure: "Start → ready in a pod, " + k.spec + " (kubernetes-provisioner on the test node; local: the same kernelgate's local kernel, in the ratio)",
			kg: "pod " + lat(pod) + "; local " + lat(loc), ratios: "pod/local " + ratio(ms(pod.p50()), ms(loc.p50()))})
		b.add(row{figure: "Isolated `1+1` from a warm pod, " + k.spec + " (local: from a warm local kernel)",
			kg: "pod " + lat(podRun) + "; local " + lat(locRun), ratios: "pod/local " + ratio(ms(podRun.p50()), ms(locRun.p50()))})
	}
	return nil
}

// podKernelspecs writes the harness's kernelspecs with kubernetes-provisioner
// (the test node runs their argv through kernelgate kernel-entry) and an
// admin kubeconfig of cp.
func podKernelspecs(dir string, cp *k8stest.ControlPlane) (specs, kubeconfig string, err error) {
	specs = filepath.Join(dir, "kernels")
	for _, k := range kernels {
		b, err := os.ReadFile(filepath.Join(specDir, k.spec, "kernel.json"))
		if err != nil {
			return "", "", err
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return "", "", err
		}
		m["metadata"] = map[string]any{"kernel_provisioner": map[string]any{
			"provisioner_name": "kubernetes-provisioner",
			"config":           map[string]any{"image": "kernelgate/bench-" + k.spec + ":1", "command": []string{kernelgateBin, "kernel-entry"}},
		}}
		out, _ := json.Marshal(m)
		if err := os.MkdirAll(filepath.Join(specs, k.spec), 0o755); err != nil {
			return "", "", err
		}
		if err := os.WriteFile(filepath.Join(specs, k.spec, "kernel.json"), out, 0o644); err != nil {
			return "", "", err
		}
	}
	c := clientcmdapi.NewConfig()
	rc := cp.Config
	c.Clusters["bench"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData, CertificateAuthority: rc.CAFile, InsecureSkipTLSVerify: rc.Insecure}
	c.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: rc.BearerToken, ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData}
	c.Contexts["bench"] = &clientcmdapi.Context{Cluster: "bench", AuthInfo: "admin", Namespace: "bench"}
	c.CurrentContext = "bench"
	kubeconfig = filepath.Join(dir, "kubeconfig")
	return specs, kubeconfig, clientcmd.WriteToFile(*c, kubeconfig)
}

// benchTB lets the harness use internal/k8stest outside a test: a fatal
// error or a skip ends the section (panic, recovered by benchK8s), and
// cleanups run when it ends.
type benchTB struct {
	testing.TB // not set: only the methods below are called
	cleanups   []func()
	msg        string
	skipped    bool
}

var errTBStop = errors.New("k8s section stopped")

func (t *benchTB) Helper()          {}
func (t *benchTB) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }
func (t *benchTB) Fatal(a ...any)   { t.msg = fmt.Sprint(a...); panic(errTBStop) }
func (t *benchTB) Fatalf(f string, a ...any) {
	t.msg = fmt.Sprintf(f, a...)
	panic(errTBStop)
}
func (t *benchTB) Skip(a ...any) { t.msg, t.skipped = fmt.Sprint(a...), true; panic(errTBStop) }

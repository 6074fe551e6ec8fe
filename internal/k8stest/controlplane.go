// Package k8stest gives tests a real Kubernetes control plane: etcd and
// kube-apiserver as child processes on free loopback ports, with RBAC and a
// static admin token (Start), identities bound to exactly a given Role
// (ServiceAccount), and a node whose pods are local processes (StartNode).
//
// The binaries come from scripts/k8s-binaries.sh, which builds them from the
// wrapper module in controlplane/ into a cache outside the checkout; `make
// test` runs it first. Without them a test skips, or fails when
// KERNELGATE_REQUIRE_ALL is set.
//
// A test of a component that runs pods:
//
//	cp := k8stest.Start(t)                 // etcd + kube-apiserver, stopped at cleanup
//	node := k8stest.StartNode(t, cp, k8stest.NodeConfig{
//		Images: map[string]k8stest.Image{"kernelgate/python:test": {}},
//	})
//	cp.CreateNamespace(t, "kernels")       // with its default ServiceAccount
//	cfg := cp.ServiceAccount(t, "kernels", "kernelgate", role) // exactly role's rights
//	... create pods with a client for cfg; k8stest.WaitPod watches one until a condition holds.
//
// Nothing here is used outside tests; it must not import the gateway's
// packages.
package k8stest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The version scripts/k8s-binaries.sh stamps into kube-apiserver.
const apiserverVersion = "v1.37.2"

const (
	// startTimeout bounds etcd and kube-apiserver coming up (3–5 s on an idle
	// machine; the machines are shared).
	startTimeout = 2 * time.Minute
	// stopGrace is how long a stopping process has after SIGTERM.
	stopGrace = 10 * time.Second
)

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	// Config authenticates as the admin (group system:masters).
	Config *rest.Config
	// Client is a clientset for Config.
	Client kubernetes.Interface
	// URL is the apiserver's https address.
	URL string

	dir       string
	pki       *pki
	etcd      *child
	apiserver *child
}

// Binaries returns the folder holding kube-apiserver and etcd:
// $KERNELGATE_K8S_BIN_DIR, or the cache folder scripts/k8s-binaries.sh
// builds into, keyed by the wrapper module's go.sum.
func Binaries() (string, error) {
	if dir := os.Getenv("KERNELGATE_K8S_BIN_DIR"); dir != "" {
		return dir, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	sum, err := os.ReadFile(filepath.Join(root, "internal", "k8stest", "controlplane", "go.sum"))
	if err != nil {
		return "", err
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		cache = filepath.Join(home, ".cache")
	}
	key := sha256.Sum256(sum)
	return filepath.Join(cache, "kernelgate", "k8s", hex.EncodeToString(key[:])[:16]), nil
}

// repoRoot is the nearest folder above the working directory (a test's
// package folder) that holds go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("k8stest: no go.mod above the working directory")
		}
		dir = parent
	}
}

// requireBinaries returns the paths of kube-apiserver and etcd, or skips
// (fails, with KERNELGATE_REQUIRE_ALL set) the test when they are missing.
func requireBinaries(t testing.TB) (apiserver, etcd string) {
	t.Helper()
	dir, err := Binaries()
	if err == nil {
		apiserver, etcd = filepath.Join(dir, "kube-apiserver"), filepath.Join(dir, "etcd")
		for _, p := range []string{apiserver, etcd} {
			if _, err = os.Stat(p); err != nil {
				break
			}
		}
	}
	if err != nil {
		msg := fmt.Sprintf("kube-apiserver and etcd not built (%v): run scripts/k8s-binaries.sh (make test does)", err)
		if os.Getenv("KERNELGATE_REQUIRE_ALL") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return apiserver, etcd
}

// Start runs etcd and kube-apiserver for the test and stops them, removing
// their data, when it ends. It returns once /readyz answers.
func Start(t testing.TB) *ControlPlane {
	t.Helper()
	apiserverBin, etcdBin := requireBinaries(t)
	var cp *ControlPlane
	var err error
	// A port picked free can be taken before the server binds it: try again.
	for attempt := 0; attempt < 3; attempt++ {
		cp, err = start(apiserverBin, etcdBin)
		if err == nil || !errors.Is(err, errAddrInUse) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	return cp
}

var errAddrInUse = errors.New("address already in use")

func start(apiserverBin, etcdBin string) (_ *ControlPlane, err error) {
	dir, err := os.MkdirTemp("", "k8stest-")
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{dir: dir}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	cp.etcd, err = startChild(dir, "etcd", etcdBin,
		"--name=k8stest",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=k8stest="+peerURL,
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return nil, err
	}

	pki, err := writePKI(dir)
	if err != nil {
		return nil, err
	}
	cp.pki = pki
	cp.URL = "https://127.0.0.1:" + strconv.Itoa(ports[2])
	cp.apiserver, err = startChild(dir, "kube-apiserver", apiserverBin,
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(ports[2]),
		"--tls-cert-file="+pki.servingCert,
		"--tls-private-key-file="+pki.servingKey,
		"--cert-dir="+filepath.Join(dir, "certs"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+pki.saPublic,
		"--service-account-signing-key-file="+pki.saPrivate,
		"--token-auth-file="+pki.tokens,
		// Exec, logs and the like go to a node's kubelet endpoint, at its
		// InternalIP (a test node's hostname resolves nowhere).
		"--kubelet-client-certificate="+pki.kubeletClientCert,
		"--kubelet-client-key="+pki.kubeletClientKey,
		"--kubelet-certificate-authority="+pki.caFile,
		"--kubelet-preferred-address-types=InternalIP",
		"--authorization-mode=RBAC",
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=0",
	)
	if err != nil {
		return nil, err
	}
	cp.Config = &rest.Config{
		Host:            cp.URL,
		BearerToken:     pki.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: pki.caPEM},
		QPS:             100,
		Burst:           200,
	}
	if err := cp.waitReady(); err != nil {
		return nil, err
	}
	cp.Client, err = kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return nil, err
	}
	return cp, nil
}

// waitReady polls /readyz until it answers 200 or a process exits.
func (cp *ControlPlane) waitReady() error {
	transport, err := rest.TransportFor(cp.Config)
	if err != nil {
		return err
	}
	client := &http.Client{Transport: transport, Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		resp, err := client.Get(cp.URL + "/readyz")
		if err == nil {
			var body bytes.Buffer
			_, _ = body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, lastLines(body.String(), 5))
		} else {
			last = err.Error()
		}
		select {
		case <-tick.C:
		case <-cp.etcd.done:
			return cp.etcd.exitError()
		case <-cp.apiserver.done:
			return cp.apiserver.exitError()
		case <-deadline.C:
			return fmt.Errorf("k8stest: kube-apiserver not ready after %v: %s\n%s", startTimeout, last, cp.apiserver.logTail())
		}
	}
}

// Stop stops kube-apiserver, then etcd, waits for both to exit and removes
// their data. It is idempotent.
func (cp *ControlPlane) Stop() {
	cp.apiserver.stop()
	cp.etcd.stop()
	if cp.dir != "" {
		os.RemoveAll(cp.dir)
		cp.dir = ""
	}
}

// CreateNamespace creates a namespace and its "default" ServiceAccount (no
// controller-manager runs to make it, and the ServiceAccount admission
// plugin rejects pods without it).
func (cp *ControlPlane) CreateNamespace(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	_, err = cp.Client.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create default ServiceAccount in %s: %v", name, err)
	}
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

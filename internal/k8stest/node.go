package k8stest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	vknode "github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

// Image is what the test node knows of an image. A container whose image
// the node does not know fails to pull. The container's own command runs
// on the host; Entrypoint and Env stand in for the image's ENTRYPOINT and
// ENV.
type Image struct {
	// Entrypoint runs when the container gives no command.
	Entrypoint []string
	// Env ("NAME=value") comes before the container's env; PATH defaults
	// to the usual Linux one.
	Env []string
}

// NodeConfig describes a test node.
type NodeConfig struct {
	// Name defaults to "k8stest-node".
	Name string
	// Labels are added to the node's (kubernetes.io/hostname, kubernetes.io/os).
	Labels map[string]string
	// Images are the images that exist, by the name pods give.
	Images map[string]Image
	// PullBackOff is how long after ErrImagePull a container reports
	// ImagePullBackOff; default 1 s.
	PullBackOff time.Duration
	// Claims are the PersistentVolumeClaims whose volumes the node
	// mounts, by name: the host folder each one's volume is. With any,
	// every container runs in a mount namespace of its own (Linux, as
	// root) where those folders are hidden and only the folders of them
	// the container mounts (its subPaths) appear, at their mountPath. A
	// claim not listed is an empty folder, as other volume types are.
	Claims map[string]string
}

// Node is a Kubernetes node whose pods are local processes. It binds pods
// that name no node to itself (no scheduler runs), runs each container's
// command in its own process group with the pod's own loopback address as
// the pod IP, and reports statuses as a kubelet would. Its kubelet
// endpoint serves exec (exec.go), so pods/exec through the apiserver runs a
// command in a pod's container. See provider.go for what it does and does
// not do.
type Node struct {
	// Name is the node's name.
	Name string

	cancel   context.CancelFunc
	done     chan struct{} // closed when everything the node started has stopped
	provider *provider
}

// StartNode registers a node with the control plane and runs it until the
// test ends. It returns once the node is registered and its pod controller
// is running.
func StartNode(t testing.TB, cp *ControlPlane, cfg NodeConfig) *Node {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "k8stest-node"
	}
	if cfg.PullBackOff == 0 {
		cfg.PullBackOff = time.Second
	}
	dir, err := os.MkdirTemp("", "k8stest-node-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Node{Name: cfg.Name, cancel: cancel, done: make(chan struct{})}

	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cp.Client.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: cfg.Name})

	// Pod IPs are 127.X.Y.2–254 with X.Y random per node, so the nodes of
	// test processes running side by side do not hand out the same address.
	base := [2]byte{byte(1 + rand.IntN(254)), byte(rand.IntN(256))}
	n.provider = newProvider(cp.Client, recorder, cfg, dir, base)
	kl, err := startKubelet(n.provider, cp.pki, cfg.Name)
	if err != nil {
		cancel()
		broadcaster.Shutdown()
		os.RemoveAll(dir)
		t.Fatal(err)
	}

	onNode := informers.NewSharedInformerFactoryWithOptions(cp.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.Name).String()
		}))
	// The provider resolves env and volumes itself (SkipDownwardAPIResolution)
	// with fresh reads, so these informers are only there to satisfy the
	// pod controller's config and are never started.
	unused := informers.NewSharedInformerFactory(cp.Client, 0)
	var nc *vknode.NodeController
	pc, err := vknode.NewPodController(vknode.PodControllerConfig{
		PodClient:                 cp.Client.CoreV1(),
		PodInformer:               onNode.Core().V1().Pods(),
		EventRecorder:             recorder,
		Provider:                  n.provider,
		ConfigMapInformer:         unused.Core().V1().ConfigMaps(),
		SecretInformer:            unused.Core().V1().Secrets(),
		ServiceInformer:           unused.Core().V1().Services(),
		SkipDownwardAPIResolution: true,
	})
	if err == nil {
		nc, err = vknode.NewNodeController(vknode.NewNaiveNodeProvider(), nodeObject(cfg, kl.port()), cp.Client.CoreV1().Nodes())
	}
	if err != nil {
		cancel()
		kl.stop()
		broadcaster.Shutdown()
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	b := newBinder(cp.Client, recorder, cfg)

	pcDone, ncDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pcDone)
		_ = pc.Run(ctx, 2)
	}()
	go func() {
		defer close(ncDone)
		_ = nc.Run(ctx)
	}()
	onNode.Start(ctx.Done())
	b.start(ctx)
	go func() {
		<-pcDone
		<-ncDone
		onNode.Shutdown()
		b.stop()
		kl.stop()
		n.provider.shutdown()
		broadcaster.Shutdown()
		os.RemoveAll(dir)
		close(n.done)
	}()
	t.Cleanup(n.Stop)

	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	for _, ready := range []<-chan struct{}{nc.Ready(), pc.Ready()} {
		select {
		case <-ready:
		case <-pcDone:
			t.Fatalf("k8stest: pod controller of node %s stopped: %v", cfg.Name, pc.Err())
		case <-ncDone:
			t.Fatalf("k8stest: node controller of node %s stopped: %v", cfg.Name, nc.Err())
		case <-timer.C:
			t.Fatalf("k8stest: node %s not ready after %v", cfg.Name, startTimeout)
		}
	}
	return n
}

// Stop stops the node's controllers and kills every pod process it
// started (SIGKILL, no grace), then waits for all of it. It is idempotent.
// The pods' API objects stay as they were.
func (n *Node) Stop() {
	n.cancel()
	<-n.done
}

// PodIPBase is the first pod IP this node hands out.
func (n *Node) PodIPBase() string { return n.provider.ips.addr(2) }

// nodeObject is the node as registered, its kubelet endpoint (exec) on
// 127.0.0.1:kubeletPort.
func nodeObject(cfg NodeConfig, kubeletPort int) *corev1.Node {
	labels := map[string]string{
		"kubernetes.io/hostname": cfg.Name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     runtime.GOARCH,
	}
	for k, v := range cfg.Labels {
		labels[k] = v
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse(fmt.Sprint(runtime.NumCPU())),
		corev1.ResourceMemory: resource.MustParse("16Gi"),
		corev1.ResourcePods:   resource.MustParse("250"),
	}
	now := metav1.Now()
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: cfg.Name, Labels: labels},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity,
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				Message: "test node is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now,
			}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(kubeletPort)}},
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: "127.0.0.1"},
				{Type: corev1.NodeHostName, Address: cfg.Name},
			},
			NodeInfo: corev1.NodeSystemInfo{
				KubeletVersion:  apiserverVersion,
				OperatingSystem: "linux",
				Architecture:    runtime.GOARCH,
			},
		},
	}
}

// Logs returns what a container of a pod on the node has written to its
// stdout and stderr so far (across restarts), while the pod is on the node.
func (n *Node) Logs(namespace, pod, container string) (string, error) {
	n.provider.mu.Lock()
	r, ok := n.provider.pods[podKey(namespace, pod)]
	n.provider.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("pod %s/%s is not on node %s", namespace, pod, n.Name)
	}
	b, err := os.ReadFile(filepath.Join(r.dir, container+".log"))
	return string(b), err
}

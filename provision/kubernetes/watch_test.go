package kubernetes

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"kernelgate/internal/leakcheck"
	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
)

// These tests drive the provisioner with client-go's fake clientset,
// which has no kubelet: the test plays it, writing pod statuses.

const ns = "kernels"

var podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

func testSpec() *kernelspecs.Spec {
	return &kernelspecs.Spec{Name: "python3", Argv: []string{"python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"},
		Metadata: map[string]any{"kernel_provisioner": map[string]any{
			"provisioner_name": "kubernetes-provisioner", "config": map[string]any{"image": "kernelgate/kernel-python:1"}}}}
}

func startProvisioner(t *testing.T, client *fake.Clientset) *Provisioner {
	t.Helper()
	p := &Provisioner{Client: client, Namespace: ns, Release: "test"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

type launched struct {
	proc jupyter.Process
	err  error
}

func launch(p *Provisioner, timeout time.Duration) <-chan launched {
	out := make(chan launched, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		proc, err := p.Launch(ctx, jupyter.LaunchRequest{KernelID: "0d7a1a0e-1111-4222-8333-444455556666", Spec: testSpec(), Kind: "jupyter"})
		out <- launched{proc, err}
	}()
	return out
}

// createdPod waits on a watch of its own for the kernel's pod to exist.
func createdPod(t *testing.T, client *fake.Clientset) *corev1.Pod {
	t.Helper()
	w, err := client.Tracker().Watch(podsGVR, ns)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if list, _ := client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{}); len(list.Items) > 0 {
		return &list.Items[0]
	}
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for {
		select {
		case ev := <-w.ResultChan():
			if pod, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added {
				return pod
			}
		case <-timer.C:
			t.Fatal("no pod was created")
		}
	}
}

// setRunning reports the pod running at ip, as a kubelet would.
func setRunning(t *testing.T, client *fake.Clientset, pod *corev1.Pod, ip string) {
	t.Helper()
	pod = pod.DeepCopy()
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, ContainerStatuses: []corev1.ContainerStatus{{
		Name: container, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}}
	if _, err := client.CoreV1().Pods(ns).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func wait(t *testing.T, ch <-chan launched) launched {
	t.Helper()
	select {
	case l := <-ch:
		return l
	case <-time.After(20 * time.Second):
		t.Fatal("Launch did not return")
	}
	return launched{}
}

// watchAfter makes the informer's first watch the one first returns; the
// watches after it are the tracker's, and each is announced on next once
// it is registered (so a status written after it reaches it).
func watchAfter(client *fake.Clientset, first func() watch.Interface) <-chan struct{} {
	next := make(chan struct{}, 8)
	var calls atomic.Int32
	client.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		if calls.Add(1) == 1 {
			return true, first(), nil
		}
		w, err := client.Tracker().Watch(podsGVR, a.GetNamespace())
		next <- struct{}{}
		return true, w, err
	})
	return next
}

// A watch the server closes while a kernel starts is opened again, and
// the pod's running status written meanwhile still ends the start.
func TestWatchClosedDuringStart(t *testing.T) {
	client := fake.NewClientset()
	fw := watch.NewFake()
	next := watchAfter(client, func() watch.Interface { return fw })
	p := startProvisioner(t, client)
	ch := launch(p, 30*time.Second)
	pod := createdPod(t, client)
	fw.Stop() // the server ends the watch
	<-next
	setRunning(t, client, pod, "10.1.2.3")
	l := wait(t, ch)
	if l.err != nil {
		t.Fatalf("launch: %v", l.err)
	}
	if ip := l.proc.ConnInfo().IP; ip != "10.1.2.3" {
		t.Errorf("kernel IP %q", ip)
	}
	l.proc.Cleanup()
}

// A watch that fails with "resource version too old" (410 Expired) makes
// the informer list again; the start goes on from the fresh list.
func TestResourceVersionTooOld(t *testing.T) {
	client := fake.NewClientset()
	var lists atomic.Int32
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists.Add(1)
		return false, nil, nil
	})
	fw := watch.NewFakeWithChanSize(1, false)
	next := watchAfter(client, func() watch.Interface { return fw })
	p := startProvisioner(t, client)
	before := lists.Load()
	ch := launch(p, 30*time.Second)
	pod := createdPod(t, client)
	setRunning(t, client, pod, "10.1.2.4") // the expired watch never carries it
	gone := apierrors.NewResourceExpired("too old resource version: 1 (2)").ErrStatus
	fw.Error(&gone)
	<-next
	l := wait(t, ch)
	if l.err != nil {
		t.Fatalf("launch: %v", l.err)
	}
	if lists.Load() <= before {
		t.Errorf("the informer did not list again after 410")
	}
	l.proc.Cleanup()
}

// A pod deleted while its kernel starts fails the start at once, saying
// so, and leaves no Secret.
func TestPodDeletedDuringStart(t *testing.T) {
	client := fake.NewClientset()
	p := startProvisioner(t, client)
	ch := launch(p, 30*time.Second)
	pod := createdPod(t, client)
	if err := client.CoreV1().Pods(ns).Delete(context.Background(), pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	l := wait(t, ch)
	if !errors.Is(l.err, jupyter.ErrStartFailed) || !strings.Contains(l.err.Error(), "deleted") {
		t.Fatalf("launch: %v", l.err)
	}
	if s, _ := client.CoreV1().Secrets(ns).List(context.Background(), metav1.ListOptions{}); len(s.Items) != 0 {
		t.Errorf("Secrets left: %d", len(s.Items))
	}
}

// A running kernel pod that ends (OOMKilled, evicted) ends its Process
// with the reason Kubernetes gives.
func TestPodDeathReported(t *testing.T) {
	for _, c := range []struct {
		name         string
		status       corev1.PodStatus
		exit, reason string
	}{
		{"OOMKilled", corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{Name: container,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}}}},
			"exit code 137", "OOMKilled"},
		{"Evicted", corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "The node was low on resource: memory."},
			"pod evicted", "Evicted"},
	} {
		t.Run(c.name, func(t *testing.T) {
			client := fake.NewClientset()
			p := startProvisioner(t, client)
			ch := launch(p, 30*time.Second)
			pod := createdPod(t, client)
			setRunning(t, client, pod, "10.1.2.5")
			l := wait(t, ch)
			if l.err != nil {
				t.Fatal(l.err)
			}
			cur, _ := client.CoreV1().Pods(ns).Get(context.Background(), pod.Name, metav1.GetOptions{})
			cur.Status = c.status
			if _, err := client.CoreV1().Pods(ns).UpdateStatus(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-l.proc.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the pod's end was not reported")
			}
			reason := l.proc.(interface{ ExitReason() string }).ExitReason()
			if l.proc.ExitStatus() != c.exit || reason != c.reason {
				t.Errorf("ended %q (%q), want %q (%q)", l.proc.ExitStatus(), reason, c.exit, c.reason)
			}
			l.proc.Cleanup()
		})
	}
}

// Start and stop cycles of the provisioner and its kernels leave no
// goroutine or file behind.
func TestCyclesLeakNothing(t *testing.T) {
	cycle := func() {
		client := fake.NewClientset()
		p := &Provisioner{Client: client, Namespace: ns, Release: "test"}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Start(ctx); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			ch := launch(p, 30*time.Second)
			setRunning(t, client, createdPod(t, client), "10.1.2.6")
			l := wait(t, ch)
			if l.err != nil {
				t.Fatal(l.err)
			}
			l.proc.Cleanup()
			<-l.proc.Done()
		}
		p.Stop()
	}
	cycle() // warm up what client-go starts once per process
	before := leakcheck.Snapshot(t)
	for range 3 {
		cycle()
	}
	leakcheck.Check(t, before)
}

// A kernel the gateway stops ends when its pod does, not when the delete
// is sent: SIGTERM deletes the pod with its grace period, SIGKILL deletes
// it at once, and Cleanup deletes only the Secret after them (the pod
// once, with its grace period whole, when only SIGTERM was needed).
func TestSignalEndsWithThePod(t *testing.T) {
	for _, c := range []struct {
		name   string
		kill   bool
		graces []int64
		exit   string
	}{
		{"TermThenPodEnds", false, []int64{terminationGrace}, "exit code 0"},
		{"TermThenKill", true, []int64{terminationGrace, 0}, "pod deleted by the gateway"},
	} {
		t.Run(c.name, func(t *testing.T) {
			client := fake.NewClientset()
			var (
				mu            sync.Mutex
				graces        []int64
				secretDeletes int
			)
			// The fake clientset deletes at once; a delete with a grace
			// period marks the pod terminating, as the API server does.
			client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				d := a.(k8stesting.DeleteAction)
				grace := int64(-1)
				if g := d.GetDeleteOptions().GracePeriodSeconds; g != nil {
					grace = *g
				}
				mu.Lock()
				graces = append(graces, grace)
				mu.Unlock()
				if grace == 0 {
					return false, nil, nil
				}
				obj, err := client.Tracker().Get(podsGVR, ns, d.GetName())
				if err != nil {
					return true, nil, err
				}
				pod := obj.(*corev1.Pod).DeepCopy()
				now := metav1.Now()
				pod.DeletionTimestamp, pod.DeletionGracePeriodSeconds = &now, &grace
				return true, nil, client.Tracker().Update(podsGVR, pod, ns)
			})
			client.PrependReactor("delete", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
				mu.Lock()
				secretDeletes++
				mu.Unlock()
				return false, nil, nil
			})
			p := startProvisioner(t, client)
			ch := launch(p, 30*time.Second)
			pod := createdPod(t, client)
			setRunning(t, client, pod, "10.1.2.7")
			l := wait(t, ch)
			if l.err != nil {
				t.Fatal(l.err)
			}
			if err := l.proc.Terminate(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-l.proc.Done():
				t.Fatal("Done closed while the pod was still terminating")
			default:
			}
			if c.kill {
				if err := l.proc.Kill(); err != nil {
					t.Fatal(err)
				}
			} else { // the kernel exits on SIGTERM
				cur, err := client.CoreV1().Pods(ns).Get(context.Background(), pod.Name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				cur.Status.Phase = corev1.PodSucceeded
				cur.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: container,
					State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}}}
				if _, err := client.CoreV1().Pods(ns).UpdateStatus(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-l.proc.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the pod's end did not end the kernel")
			}
			if err := l.proc.Cleanup(); err != nil {
				t.Fatal(err)
			}
			if got := l.proc.ExitStatus(); got != c.exit {
				t.Errorf("ended %q, want %q", got, c.exit)
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(graces, c.graces) || secretDeletes != 1 {
				t.Errorf("pod deletes with grace %v and %d Secret deletes; want %v and 1", graces, secretDeletes, c.graces)
			}
		})
	}
}

// Sweep deletes the kernel pods of the release it is not told to keep
// and every Secret without a kept pod, each once; kept kernels and other
// releases' objects stay.
func TestSweep(t *testing.T) {
	client := fake.NewClientset()
	var (
		mu      sync.Mutex
		deletes = map[string]int{}
	)
	client.PrependReactor("delete", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		deletes[a.GetResource().Resource+"/"+a.(k8stesting.DeleteAction).GetName()]++
		mu.Unlock()
		return false, nil, nil
	})
	ctx := context.Background()
	add := func(release, kernelID string, withPod bool) string {
		pp := podParams{Name: podName(kernelID), Namespace: ns, Release: release, KernelID: kernelID, Kind: "jupyter"}
		if _, err := client.CoreV1().Secrets(ns).Create(ctx, buildSecret(pp, "k"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if withPod {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pp.Name, Namespace: ns, Labels: pp.labels()}}
			if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		return pp.Name
	}
	kept := add("test", "kept", true)
	stale := add("test", "stale", true)
	orphan := add("test", "orphan", false)
	other := add("other", "stale", true)
	p := startProvisioner(t, client)
	n, err := p.Sweep(ctx, map[string]bool{"kept": true})
	if err != nil || n != 1 {
		t.Fatalf("Sweep: %d pods, %v; want 1", n, err)
	}
	exists := func(res, name string) bool {
		var err error
		if res == "pods" {
			_, err = client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		} else {
			_, err = client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		}
		return err == nil
	}
	for _, c := range []struct {
		res, name string
		want      bool
	}{
		{"pods", kept, true}, {"secrets", kept, true}, {"pods", other, true}, {"secrets", other, true},
		{"pods", stale, false}, {"secrets", stale, false}, {"secrets", orphan, false},
	} {
		if got := exists(c.res, c.name); got != c.want {
			t.Errorf("%s/%s exists: %v, want %v", c.res, c.name, got, c.want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]int{"pods/" + stale: 1, "secrets/" + stale: 1, "secrets/" + orphan: 1}
	if !maps.Equal(deletes, want) {
		t.Errorf("deletes %v, want %v", deletes, want)
	}
}

// A new gateway lists and adopts a running kernel pod from its informer's
// cache, without asking the API server for pods again.
func TestReadoptFromCache(t *testing.T) {
	client := fake.NewClientset()
	first := startProvisioner(t, client)
	ch := launch(first, 30*time.Second)
	setRunning(t, client, createdPod(t, client), "10.1.2.8")
	l := wait(t, ch)
	if l.err != nil {
		t.Fatal(l.err)
	}
	want, err := l.proc.(jupyter.InfoProcess).ProvisionerInfo()
	if err != nil {
		t.Fatal(err)
	}
	l.proc.(jupyter.Releaser).Release()

	p := startProvisioner(t, client)
	var podReads atomic.Int32
	client.PrependReactor("*", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() == "get" || a.GetVerb() == "list" {
			podReads.Add(1)
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	found, err := p.List(ctx)
	if err != nil || len(found) != 1 {
		t.Fatalf("List: %v %v", found, err)
	}
	if f := found[0]; f.KernelID != "0d7a1a0e-1111-4222-8333-444455556666" || f.Spec != "python3" ||
		f.Info.Connection != want.Connection || string(f.Info.Data) != string(want.Data) {
		t.Errorf("found %+v, want info %+v", f, want)
	}
	proc, err := p.Adopt(ctx, found[0].Info)
	if err != nil {
		t.Fatal(err)
	}
	if ip := proc.ConnInfo().IP; ip != "10.1.2.8" {
		t.Errorf("adopted kernel at %q", ip)
	}
	if n := podReads.Load(); n != 0 {
		t.Errorf("%d pod reads from the API server", n)
	}
	proc.Cleanup()
}

package k8stest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// WaitTimeout bounds WaitPod.
const WaitTimeout = time.Minute

// WaitPod watches the pod namespace/name until cond holds and returns it;
// cond sees nil once the pod is deleted. It fails the test, with the last
// pod seen, after WaitTimeout.
func WaitPod(t testing.TB, client kubernetes.Interface, namespace, name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
	defer cancel()
	selector := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return client.CoreV1().Pods(namespace).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return client.CoreV1().Pods(namespace).Watch(ctx, o)
		},
	}
	var last *corev1.Pod
	ev, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, func(store cache.Store) (bool, error) {
		if len(store.List()) == 0 {
			return cond(nil), nil
		}
		return false, nil
	}, func(e watch.Event) (bool, error) {
		if e.Type == watch.Deleted {
			return cond(nil), nil
		}
		pod, ok := e.Object.(*corev1.Pod)
		if !ok {
			return false, nil
		}
		last = pod
		return cond(pod), nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s never %s (%v); last seen: %s", namespace, name, what, err, describePod(last))
	}
	if ev == nil || ev.Type == watch.Deleted {
		return nil
	}
	pod, _ := ev.Object.(*corev1.Pod)
	return pod
}

func describePod(pod *corev1.Pod) string {
	if pod == nil {
		return "none"
	}
	s := string(pod.Status.Phase)
	for _, c := range pod.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			s += " " + string(c.Type) + "=" + string(c.Status) + "(" + c.Reason + ")"
		}
	}
	for _, c := range pod.Status.ContainerStatuses {
		switch {
		case c.State.Waiting != nil:
			s += " " + c.Name + ":waiting " + c.State.Waiting.Reason + " " + c.State.Waiting.Message
		case c.State.Running != nil:
			s += " " + c.Name + ":running"
		case c.State.Terminated != nil:
			s += " " + c.Name + ":terminated " + c.State.Terminated.Reason
		}
	}
	return s
}

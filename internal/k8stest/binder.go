package k8stest

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
)

// binder stands in for the scheduler: it binds each pod that names no node
// to the test node when the pod's nodeSelector matches the node's labels,
// and otherwise marks it PodScheduled=False, reason Unschedulable, with the
// scheduler's message.
type binder struct {
	client   kubernetes.Interface
	recorder record.EventRecorder
	node     string
	labels   map[string]string

	factory informers.SharedInformerFactory
	lister  func(namespace, name string) (*corev1.Pod, error)
	queue   workqueue.TypedRateLimitingInterface[string]
	wg      sync.WaitGroup
}

func newBinder(client kubernetes.Interface, recorder record.EventRecorder, cfg NodeConfig) *binder {
	b := &binder{
		client:   client,
		recorder: recorder,
		node:     cfg.Name,
		labels:   nodeObject(cfg, 0).Labels,
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
	}
	b.factory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", "").String()
		}))
	pods := b.factory.Core().V1().Pods()
	lister := pods.Lister()
	b.lister = func(ns, name string) (*corev1.Pod, error) { return lister.Pods(ns).Get(name) }
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			b.queue.Add(key)
		}
	}
	_, _ = pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	})
	return b
}

func (b *binder) start(ctx context.Context) {
	b.factory.Start(ctx.Done())
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for b.next(ctx) {
		}
	}()
}

// stop ends the worker and the informer; the context given to start must
// be cancelled first.
func (b *binder) stop() {
	b.queue.ShutDown()
	b.wg.Wait()
	b.factory.Shutdown()
}

func (b *binder) next(ctx context.Context) bool {
	key, quit := b.queue.Get()
	if quit {
		return false
	}
	defer b.queue.Done(key)
	if err := b.sync(ctx, key); err != nil && ctx.Err() == nil {
		b.queue.AddRateLimited(key)
		return true
	}
	b.queue.Forget(key)
	return true
}

func (b *binder) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := b.lister(ns, name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil ||
		pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if b.fits(pod) {
		err := b.client.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: pod.UID},
			Target:     corev1.ObjectReference{Kind: "Node", Name: b.node},
		}, metav1.CreateOptions{})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil // gone, or bound meanwhile
		}
		if err == nil {
			b.recorder.Eventf(pod, corev1.EventTypeNormal, "Scheduled", "Successfully assigned %s/%s to %s", ns, name, b.node)
		}
		return err
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return nil
		}
	}
	msg := "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
	pod = pod.DeepCopy()
	cond := corev1.PodCondition{
		Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
		Message: msg, LastTransitionTime: metav1.Now(),
	}
	replaced := false
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == corev1.PodScheduled {
			pod.Status.Conditions[i], replaced = cond, true
		}
	}
	if !replaced {
		pod.Status.Conditions = append(pod.Status.Conditions, cond)
	}
	if _, err := b.client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("mark %s unschedulable: %w", key, err)
	}
	b.recorder.Event(pod, corev1.EventTypeWarning, "FailedScheduling", msg)
	return nil
}

// fits reports whether the pod's nodeSelector matches the node's labels.
func (b *binder) fits(pod *corev1.Pod) bool {
	for k, v := range pod.Spec.NodeSelector {
		if got, ok := b.labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

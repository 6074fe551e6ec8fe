package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"kernelgate/jupyter"
)

// podProcess is a kernel running in a pod: the jupyter.Process of
// kubernetes-provisioner. The informer's events drive it (update).
type podProcess struct {
	p          *Provisioner
	name       string
	kernelName string
	key        string

	changed chan struct{} // a state change for waitRunning
	done    chan struct{}

	mu       sync.Mutex
	uid      types.UID
	ip       string
	failure  string // why the pod cannot start, once known
	ended    bool
	status   string
	reason   string
	output   string
	cleaned  bool
	deleting bool // the gateway is ending the pod: its deletion is no death
	deleted  bool // the API server took a delete of the pod
}

func newPodProcess(p *Provisioner, name, kernelName, key string) *podProcess {
	return &podProcess{p: p, name: name, kernelName: kernelName, key: key,
		changed: make(chan struct{}, 1), done: make(chan struct{})}
}

func (pp *podProcess) setUID(uid types.UID) {
	pp.mu.Lock()
	pp.uid = uid
	pp.mu.Unlock()
}

func (pp *podProcess) notify() {
	select {
	case pp.changed <- struct{}{}:
	default:
	}
}

// waitingFailures are the waiting reasons of a container that will not
// start without someone changing something.
var waitingFailures = map[string]bool{
	"ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true,
	"CreateContainerConfigError": true, "CreateContainerError": true, "CrashLoopBackOff": true,
	"RunContainerError": true,
}

// update takes in the pod as the informer saw it.
func (pp *podProcess) update(pod *corev1.Pod, deleted bool) {
	pp.mu.Lock()
	if pp.uid != "" && pod.UID != pp.uid {
		pp.mu.Unlock()
		return
	}
	if pp.uid == "" {
		pp.uid = pod.UID
	}
	deleting := pp.deleting
	pp.mu.Unlock()

	st := containerStatus(pod)
	switch {
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		status, reason, out := "pod "+strings.ToLower(string(pod.Status.Phase)), pod.Status.Reason, pod.Status.Message
		if st != nil && st.State.Terminated != nil {
			t := st.State.Terminated
			status, reason = fmt.Sprintf("exit code %d", t.ExitCode), t.Reason
			if t.Message != "" {
				out = t.Message
			}
		}
		if reason == "Evicted" {
			status = "pod evicted"
		}
		pp.finish(status, reason, out)
	case deleted && deleting:
		pp.finish("pod deleted by the gateway", "", "")
	case deleted:
		pp.finish("pod deleted", "", "")
	case pod.DeletionTimestamp != nil:
		// Deleted by someone else: the kernel is lost. Deleted by the
		// gateway: it ends once the pod is gone or terminated.
		if !deleting {
			pp.finish("pod deleted", pod.Status.Reason, pod.Status.Message)
		}
	default:
		pp.mu.Lock()
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				pp.failure = fmt.Sprintf("pod %s is Unschedulable: %s", pp.name, c.Message)
			}
		}
		if st != nil && st.State.Waiting != nil && waitingFailures[st.State.Waiting.Reason] {
			pp.failure = fmt.Sprintf("pod %s: %s: %s", pp.name, st.State.Waiting.Reason, st.State.Waiting.Message)
		}
		if pod.Status.Phase == corev1.PodRunning && st != nil && st.State.Running != nil && pod.Status.PodIP != "" {
			pp.ip = pod.Status.PodIP
		}
		pp.mu.Unlock()
	}
	pp.notify()
}

func containerStatus(pod *corev1.Pod) *corev1.ContainerStatus {
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == container {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// finish records how the kernel's pod ended and closes Done; only the
// first call counts.
func (pp *podProcess) finish(status, reason, output string) {
	pp.mu.Lock()
	if pp.ended {
		pp.mu.Unlock()
		return
	}
	pp.ended = true
	pp.status, pp.reason, pp.output = status, reason, output
	pp.mu.Unlock()
	close(pp.done)
	pp.notify()
}

// waitRunning waits until the pod runs with its IP, or fails with the
// reason it will not.
func (pp *podProcess) waitRunning(ctx context.Context) error {
	for {
		pp.mu.Lock()
		ip, failure, ended := pp.ip, pp.failure, pp.ended
		status, reason, out := pp.status, pp.reason, pp.output
		pp.mu.Unlock()
		switch {
		case ended:
			msg := fmt.Sprintf("pod %s ended before its kernel ran: %s", pp.name, status)
			if reason != "" {
				msg += " (" + reason + ")"
			}
			if out = strings.TrimSpace(out); out != "" {
				msg += ": " + out
			}
			return fmt.Errorf("%s", msg)
		case failure != "":
			return fmt.Errorf("%s", failure)
		case ip != "":
			return nil
		}
		select {
		case <-pp.changed:
		case <-ctx.Done():
			return fmt.Errorf("%w: pod %s not running: %w", jupyter.ErrStartTimeout, pp.name, ctx.Err())
		}
	}
}

func (pp *podProcess) ConnInfo() jupyter.ConnInfo {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return connInfo(pp.ip, pp.key, pp.kernelName)
}

// PID is 0: the kernel is not a process of this host.
func (pp *podProcess) PID() int              { return 0 }
func (pp *podProcess) Done() <-chan struct{} { return pp.done }

func (pp *podProcess) ExitStatus() string {
	select {
	case <-pp.done:
	default:
		return ""
	}
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return pp.status
}

// ExitReason is the reason Kubernetes gives, e.g. OOMKilled or Evicted.
func (pp *podProcess) ExitReason() string {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if pp.reason == "Completed" {
		return ""
	}
	return pp.reason
}

// Output is the container's termination message (the end of its log
// when it failed).
func (pp *podProcess) Output() string {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return pp.output
}

// Interrupt: a pod cannot be signalled; interrupts go by message.
func (pp *podProcess) Interrupt() error { return jupyter.ErrInterruptByMessage }

// Terminate deletes the pod with its grace period.
func (pp *podProcess) Terminate() error { return pp.Signal(syscall.SIGTERM) }

// Kill deletes the pod at once.
func (pp *podProcess) Kill() error { return pp.Signal(syscall.SIGKILL) }

// Signal: SIGTERM deletes the pod with its grace period, SIGKILL at once;
// Done closes when the informer sees the pod gone or terminated. Other
// signals cannot reach a pod (interrupts go by message).
func (pp *podProcess) Signal(sig syscall.Signal) error {
	select {
	case <-pp.done:
		return os.ErrProcessDone
	default:
	}
	switch sig {
	case syscall.SIGTERM, syscall.SIGKILL:
		grace := int64(0)
		if sig == syscall.SIGTERM {
			grace = terminationGrace
		}
		pp.mu.Lock()
		pp.deleting = true
		pp.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
		defer cancel()
		if err := pp.p.deletePod(ctx, pp.name, grace); err != nil {
			return err
		}
		pp.mu.Lock()
		pp.deleted = true
		pp.mu.Unlock()
		return nil
	case 0:
		return nil
	}
	return fmt.Errorf("%w: signal %v to a kernel pod", jupyter.ErrNotSupported, sig)
}

// Cleanup stops watching the pod and deletes it, unless a signal already
// did, and its Secret.
func (pp *podProcess) Cleanup() error {
	pp.mu.Lock()
	done, deleted := pp.cleaned, pp.deleted
	pp.cleaned, pp.deleting = true, true
	pp.mu.Unlock()
	if done {
		return nil
	}
	pp.p.untrack(pp)
	ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
	defer cancel()
	var errPod error
	if !deleted {
		errPod = pp.p.deletePod(ctx, pp.name, 0)
	}
	errSecret := pp.p.deleteSecret(ctx, pp.name)
	pp.finish("pod deleted by the gateway", "", "")
	return errors.Join(errPod, errSecret)
}

// Release stops watching the pod and leaves it running (for another
// gateway to adopt).
func (pp *podProcess) Release() {
	pp.p.untrack(pp)
	pp.finish("released", "", "")
}

// ProvisionerInfo says how to find the pod again.
func (pp *podProcess) ProvisionerInfo() (jupyter.ProvisionerInfo, error) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return podInfo(podData{Namespace: pp.p.Namespace, Pod: pp.name, UID: pp.uid}, connInfo(pp.ip, pp.key, pp.kernelName)), nil
}

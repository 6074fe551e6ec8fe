package k8stest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	vknode "github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"kernelgate/internal/sysproc"
)

// The provider runs pods as local processes, as virtual-kubelet's
// PodLifecycleHandler and PodNotifier:
//   - each container's command and args run as a process in a group of its
//     own, with the cwd and HOME of a folder of the pod's, its env
//     resolved as the kubelet does (values, $(VAR), fieldRef including
//     status.podIP, resourceFieldRef, secretKeyRef, configMapKeyRef,
//     envFrom), and the pod's own loopback address as its pod IP;
//   - Secret, ConfigMap and emptyDir volumes are folders of the pod's; a
//     process cannot see them at their mountPath (there is no mount
//     namespace), so a command argument, env value or workingDir that
//     starts with a mountPath is rewritten to the folder;
//   - an image the node does not know waits ErrImagePull, then
//     ImagePullBackOff; a missing Secret, ConfigMap or key waits
//     CreateContainerConfigError (and starts once it exists); a process
//     whose process group's resident memory (sampled every 50 ms) exceeds
//     the container's memory limit is killed and terminates OOMKilled,
//     137; any other exit terminates Completed (0) or Error with the exit
//     code (128+n for signal n); restartPolicy Always and OnFailure
//     restart a container after a CrashLoopBackOff wait (1 s doubling to
//     10 s);
//   - delete sends SIGTERM to each process group, then SIGKILL after the
//     grace period, and reports the terminal status;
//   - exec runs a command in a running container's env, cwd and process
//     group (exec.go);
//   - the volumes of the claims NodeConfig.Claims lists are mounted for
//     real: on a node with claims each container runs in a mount namespace
//     of its own where the claims' host folders are hidden and only the
//     subPaths it mounts appear at their mountPath (claims.go); exec
//     enters that namespace.
//
// Not done: init containers (a pod with any fails to create), probes,
// ephemeral containers, securityContext (processes run as the test's
// user), requests and CPU limits, other volume types (empty folders).
type provider struct {
	client      kubernetes.Interface
	recorder    record.EventRecorder
	images      map[string]Image
	pullBackOff time.Duration
	claims      map[string]string // NodeConfig.Claims
	dir         string
	ips         *ipPool

	ctx    context.Context // ends at shutdown
	cancel context.CancelFunc
	wg     sync.WaitGroup // every pod's goroutines and the notifier

	notify func(*corev1.Pod)
	wake   chan struct{} // the notifier has queued snapshots

	mu   sync.Mutex
	pods map[string]*podRun // by namespace/name, until deleted
	// terminating holds deleted pods, by UID, until their processes end;
	// a new pod of the same name can start meanwhile.
	terminating map[types.UID]*podRun
	queued      []*corev1.Pod // snapshots for the notifier, oldest first
}

var _ vknode.PodLifecycleHandler = (*provider)(nil)
var _ vknode.PodNotifier = (*provider)(nil)

// podRun is one pod on the node. Its fields other than the immutable ones
// are guarded by provider.mu.
type podRun struct {
	key  string
	dir  string // holds home/ and volumes/
	ip   string
	stop chan struct{} // closed when the pod is deleted or the node stops
	ref  *corev1.Pod   // the pod as created, for events

	pod        *corev1.Pod // spec as created, status as reported
	containers []*containerRun
	stopping   bool
	grace      time.Duration
	finished   bool // every container is done for good
}

type containerRun struct {
	spec  corev1.Container
	final bool // will not run again
	// running is the container's process while it runs, for exec.
	running *runningProcess
}

// runningProcess is a container's running process and the commands
// exec started in it.
type runningProcess struct {
	pid   int
	env   []string
	dir   string
	execs map[int]bool // by pid
	// mountNS: the process has a mount namespace of its own (claims),
	// which the commands exec runs in it enter.
	mountNS bool
}

func newProvider(client kubernetes.Interface, recorder record.EventRecorder, cfg NodeConfig, dir string, base [2]byte) *provider {
	ctx, cancel := context.WithCancel(context.Background())
	return &provider{
		client: client, recorder: recorder, images: cfg.Images, pullBackOff: cfg.PullBackOff, claims: cfg.Claims, dir: dir,
		ips: &ipPool{base: base, used: map[byte]bool{}},
		ctx: ctx, cancel: cancel,
		wake: make(chan struct{}, 1),
		pods: map[string]*podRun{}, terminating: map[types.UID]*podRun{},
	}
}

// NotifyPods registers virtual-kubelet's callback. It is called only from
// the notifier goroutine, never under p.mu, in the order statuses changed.
func (p *provider) NotifyPods(_ context.Context, f func(*corev1.Pod)) {
	p.notify = f
	p.wg.Add(1)
	go p.notifier()
}

func (p *provider) notifier() {
	defer p.wg.Done()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-p.wake:
		}
		p.mu.Lock()
		batch := p.queued
		p.queued = nil
		p.mu.Unlock()
		for _, pod := range batch {
			p.notify(pod)
		}
	}
}

// changedLocked records the pod's new status for the notifier; p.mu is held.
func (p *provider) changedLocked(r *podRun) {
	p.updatePhaseLocked(r)
	p.queued = append(p.queued, r.pod.DeepCopy())
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func podKey(namespace, name string) string { return namespace + "/" + name }

// CreatePod starts the pod's containers.
func (p *provider) CreatePod(_ context.Context, pod *corev1.Pod) error {
	if len(pod.Spec.InitContainers) > 0 {
		return errdefs.InvalidInput("the test node does not run init containers")
	}
	key := podKey(pod.Namespace, pod.Name)
	p.mu.Lock()
	if old, ok := p.pods[key]; ok {
		if old.pod.UID == pod.UID {
			p.mu.Unlock()
			return nil
		}
		// A pod of the same name that the node missed the deletion of.
		p.stopLocked(old, graceOf(old.pod))
	}
	ip, err := p.ips.take()
	if err != nil {
		p.mu.Unlock()
		return err
	}
	r := &podRun{
		key:  key,
		dir:  filepath.Join(p.dir, pod.Namespace+"_"+pod.Name+"_"+string(pod.UID)),
		ip:   ip,
		stop: make(chan struct{}),
		pod:  pod.DeepCopy(),
		ref:  pod.DeepCopy(),
	}
	now := metav1.Now()
	r.pod.Status = corev1.PodStatus{
		Phase:     corev1.PodPending,
		HostIP:    "127.0.0.1",
		HostIPs:   []corev1.HostIP{{IP: "127.0.0.1"}},
		PodIP:     ip,
		PodIPs:    []corev1.PodIP{{IP: ip}},
		StartTime: &now,
		QOSClass:  pod.Status.QOSClass,
	}
	for _, c := range pod.Spec.Containers {
		r.containers = append(r.containers, &containerRun{spec: c})
		r.pod.Status.ContainerStatuses = append(r.pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name:  c.Name,
			Image: c.Image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}},
		})
	}
	p.pods[key] = r
	p.changedLocked(r)
	p.wg.Add(1)
	p.mu.Unlock()
	go p.runPod(r)
	return nil
}

// UpdatePod accepts label, annotation and image changes without acting on them.
func (p *provider) UpdatePod(context.Context, *corev1.Pod) error { return nil }

// DeletePod stops the pod's processes (SIGTERM, SIGKILL after the grace
// period); the terminal status follows through NotifyPods.
func (p *provider) DeletePod(_ context.Context, pod *corev1.Pod) error {
	key := podKey(pod.Namespace, pod.Name)
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.terminating[pod.UID]; ok {
		return nil
	}
	r, ok := p.pods[key]
	if !ok || (pod.UID != "" && r.pod.UID != pod.UID) {
		return errdefs.NotFoundf("pod %s (uid %s) is not on this node", key, pod.UID)
	}
	r.pod.DeletionTimestamp = pod.DeletionTimestamp
	r.pod.DeletionGracePeriodSeconds = pod.DeletionGracePeriodSeconds
	p.stopLocked(r, graceOf(pod))
	return nil
}

// graceOf is the pod's termination grace period.
func graceOf(pod *corev1.Pod) time.Duration {
	if s := pod.DeletionGracePeriodSeconds; s != nil {
		return time.Duration(*s) * time.Second
	}
	if s := pod.Spec.TerminationGracePeriodSeconds; s != nil {
		return time.Duration(*s) * time.Second
	}
	return 30 * time.Second
}

// stopLocked takes the pod off the node: a finished one at once, a running
// one once its processes end (runPod). p.mu is held.
func (p *provider) stopLocked(r *podRun, grace time.Duration) {
	delete(p.pods, r.key)
	if r.finished {
		p.ips.give(r.ip)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			os.RemoveAll(r.dir)
		}()
		return
	}
	p.terminating[r.pod.UID] = r
	r.stopping = true
	r.grace = grace
	close(r.stop)
}

// GetPod returns the pod as the node runs it.
func (p *provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.pods[podKey(namespace, name)]
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not on this node", namespace, name)
	}
	return r.pod.DeepCopy(), nil
}

// GetPodStatus returns the pod's status.
func (p *provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods returns every pod on the node.
func (p *provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(p.pods))
	for _, r := range p.pods {
		out = append(out, r.pod.DeepCopy())
	}
	return out, nil
}

// shutdown kills every pod's processes at once and waits for every
// goroutine of the provider.
func (p *provider) shutdown() {
	p.mu.Lock()
	for _, r := range p.pods {
		p.stopLocked(r, 0)
	}
	p.mu.Unlock()
	p.cancel() // ends grace periods: processes are killed at once
	p.wg.Wait()
}

// runPod prepares the pod's folders, runs its containers and, once all are
// done for good, reports the pod finished (or removes it when deleted).
func (p *provider) runPod(r *podRun) {
	defer p.wg.Done()
	var wg sync.WaitGroup
	for i := range r.containers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.runContainer(r, i)
		}()
	}
	wg.Wait()
	p.mu.Lock()
	r.finished = true
	removed := r.stopping
	if removed {
		delete(p.terminating, r.pod.UID)
		p.ips.give(r.ip)
	}
	p.changedLocked(r)
	p.mu.Unlock()
	if removed {
		os.RemoveAll(r.dir)
	}
}

// runContainer runs one container until it is done for good: it exits
// and is not to be restarted, or the pod is deleted.
func (p *provider) runContainer(r *podRun, i int) {
	c := r.containers[i].spec
	restarts := int32(0)
	backoff := time.Second
	var last *corev1.ContainerStateTerminated
	defer func() {
		p.mu.Lock()
		r.containers[i].final = true
		st := &r.pod.Status.ContainerStatuses[i]
		if st.State.Terminated == nil {
			// Never ran, or waiting to run again: as the kubelet reports it.
			p.setStateLocked(r, i, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 137, Reason: "ContainerStatusUnknown",
				Message:    "The container could not be located when the pod was terminated",
				FinishedAt: metav1.Now(),
			}})
		}
		p.mu.Unlock()
	}()

	img, known := p.images[c.Image]
	if !known {
		p.wait(r, i, "ErrImagePull", fmt.Sprintf("failed to pull image %q: image not known to the test node", c.Image), 0)
		p.recorder.Eventf(r.ref, corev1.EventTypeWarning, "Failed", "Failed to pull image %q: not known to the test node", c.Image)
		if !sleep(r.stop, p.pullBackOff) {
			return
		}
		p.wait(r, i, "ImagePullBackOff", fmt.Sprintf("Back-off pulling image %q", c.Image), 0)
		<-r.stop
		return
	}
	for {
		spec, err := p.prepare(r, c, img)
		if err != nil {
			var ce *configError
			reason := "CreateContainerConfigError"
			if errors.As(err, &ce) && ce.volume {
				reason = "ContainerCreating"
			}
			p.wait(r, i, reason, err.Error(), restarts)
			if !sleep(r.stop, time.Second) {
				return
			}
			continue
		}
		term := p.runProcess(r, i, spec, restarts, last)
		if term == nil {
			return // stopped before it started
		}
		last = term
		p.mu.Lock()
		stopping := r.stopping
		p.mu.Unlock()
		if stopping || !restartable(r.ref.Spec.RestartPolicy, term.ExitCode) {
			return
		}
		restarts++
		p.mu.Lock()
		st := &r.pod.Status.ContainerStatuses[i]
		st.RestartCount = restarts
		st.LastTerminationState = corev1.ContainerState{Terminated: last}
		p.setStateLocked(r, i, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
			Reason:  "CrashLoopBackOff",
			Message: fmt.Sprintf("back-off %v restarting failed container=%s pod=%s_%s(%s)", backoff, c.Name, r.ref.Name, r.ref.Namespace, r.ref.UID),
		}})
		p.mu.Unlock()
		if !sleep(r.stop, backoff) {
			return
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

func restartable(policy corev1.RestartPolicy, code int32) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return code != 0
	default:
		return true
	}
}

// sleep waits d or until stop closes; it reports whether d passed.
func sleep(stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	}
}

// wait reports container i waiting for reason.
func (p *provider) wait(r *podRun, i int, reason, msg string, restarts int32) {
	p.mu.Lock()
	r.pod.Status.ContainerStatuses[i].RestartCount = restarts
	p.setStateLocked(r, i, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}})
	p.mu.Unlock()
}

func (p *provider) setStateLocked(r *podRun, i int, s corev1.ContainerState) {
	st := &r.pod.Status.ContainerStatuses[i]
	st.State = s
	st.Ready = s.Running != nil
	started := s.Running != nil
	st.Started = &started
	p.changedLocked(r)
}

// updatePhaseLocked derives the pod's phase and conditions from its
// containers, as the kubelet does.
func (p *provider) updatePhaseLocked(r *podRun) {
	s := &r.pod.Status
	allFinal, allReady, anyStarted, allZero := true, true, false, true
	for i, c := range r.containers {
		st := s.ContainerStatuses[i]
		if !c.final {
			allFinal = false
		}
		if !st.Ready {
			allReady = false
		}
		if st.State.Running != nil || st.RestartCount > 0 || (st.State.Terminated != nil && st.State.Terminated.Reason != "ContainerStatusUnknown") {
			anyStarted = true
		}
		if st.State.Terminated == nil || st.State.Terminated.ExitCode != 0 {
			allZero = false
		}
	}
	switch {
	case allFinal && len(r.containers) > 0 && allZero:
		s.Phase = corev1.PodSucceeded
	case allFinal:
		s.Phase = corev1.PodFailed
	case anyStarted:
		s.Phase = corev1.PodRunning
	default:
		s.Phase = corev1.PodPending
	}
	ready := corev1.ConditionFalse
	if allReady && len(r.containers) > 0 {
		ready = corev1.ConditionTrue
	}
	s.Conditions = setCondition(s.Conditions, corev1.PodScheduled, corev1.ConditionTrue)
	s.Conditions = setCondition(s.Conditions, corev1.PodInitialized, corev1.ConditionTrue)
	s.Conditions = setCondition(s.Conditions, corev1.PodReadyToStartContainers, corev1.ConditionTrue)
	s.Conditions = setCondition(s.Conditions, corev1.ContainersReady, ready)
	s.Conditions = setCondition(s.Conditions, corev1.PodReady, ready)
}

func setCondition(conds []corev1.PodCondition, typ corev1.PodConditionType, status corev1.ConditionStatus) []corev1.PodCondition {
	for i := range conds {
		if conds[i].Type == typ {
			if conds[i].Status != status {
				conds[i].Status = status
				conds[i].LastTransitionTime = metav1.Now()
			}
			return conds
		}
	}
	return append(conds, corev1.PodCondition{Type: typ, Status: status, LastTransitionTime: metav1.Now()})
}

// runProcess starts the container's process and waits for it to end (or
// for the pod's deletion, then stops it). It returns the terminated
// state, or nil when the pod was deleted before the process started.
func (p *provider) runProcess(r *podRun, i int, spec *processSpec, restarts int32, last *corev1.ContainerStateTerminated) *corev1.ContainerStateTerminated {
	select {
	case <-r.stop:
		spec.log.Close()
		return nil
	default:
	}
	c := r.containers[i].spec
	argv, attr := spec.argv, sysproc.GroupAttr()
	var err error
	mountNS := len(spec.claims.hidden) > 0
	if mountNS {
		if err = mountNamespace(attr); err == nil {
			argv, err = spec.claims.wrap(argv, filepath.Join(r.dir, "claims", c.Name))
		}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = spec.env
	cmd.Dir = spec.dir
	cmd.Stdout, cmd.Stderr = spec.log, spec.log
	cmd.SysProcAttr = attr
	if err == nil {
		err = cmd.Start()
	}
	spec.log.Close()
	if err != nil {
		term := &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: err.Error(), FinishedAt: metav1.Now()}
		p.mu.Lock()
		p.setStateLocked(r, i, corev1.ContainerState{Terminated: term})
		p.mu.Unlock()
		p.recorder.Eventf(r.ref, corev1.EventTypeWarning, "Failed", "Error: %v", err)
		return term
	}
	pid := cmd.Process.Pid
	started := metav1.Now()
	p.mu.Lock()
	st := &r.pod.Status.ContainerStatuses[i]
	st.ContainerID = fmt.Sprintf("process://%d", pid)
	st.ImageID = "k8stest://" + c.Image
	st.RestartCount = restarts
	if last != nil {
		st.LastTerminationState = corev1.ContainerState{Terminated: last}
	}
	p.setStateLocked(r, i, corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}})
	dir := spec.dir
	if spec.claims.workDir != "" {
		dir = spec.claims.workDir // the same path in the namespace
	}
	r.containers[i].running = &runningProcess{pid: pid, env: spec.env, dir: dir, execs: map[int]bool{}, mountNS: mountNS}
	p.mu.Unlock()
	p.recorder.Eventf(r.ref, corev1.EventTypeNormal, "Started", "Started container %s", c.Name)

	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	var limit int64
	if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		limit = q.Value()
	}
	var sample <-chan time.Time
	if limit > 0 {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		sample = tick.C
	}
	oom := false
	stop := r.stop
	var kill <-chan time.Time
wait:
	for {
		select {
		case <-exited:
			break wait
		case <-sample:
			if groupRSS(pid) > limit {
				oom = true
				_ = sysproc.Kill(-pid, syscall.SIGKILL)
				sample = nil
			}
		case <-stop:
			stop = nil
			p.mu.Lock()
			grace := r.grace
			p.mu.Unlock()
			p.recorder.Eventf(r.ref, corev1.EventTypeNormal, "Killing", "Stopping container %s", c.Name)
			_ = sysproc.Kill(-pid, syscall.SIGTERM)
			t := time.NewTimer(grace)
			defer t.Stop()
			kill = t.C
		case <-kill:
			kill = nil
			_ = sysproc.Kill(-pid, syscall.SIGKILL)
		case <-p.ctx.Done():
			// The node stops: no grace.
			_ = sysproc.Kill(-pid, syscall.SIGKILL)
			<-exited
			break wait
		}
	}
	// What the leader leaves behind in its group goes with it, as a
	// container's processes go with it, and so do the commands exec
	// started in it, also those that made a process group of their own.
	p.mu.Lock()
	execs := slices.Collect(maps.Keys(r.containers[i].running.execs))
	r.containers[i].running = nil
	p.mu.Unlock()
	_ = sysproc.Kill(-pid, syscall.SIGKILL)
	for _, e := range execs {
		_ = sysproc.Kill(-e, syscall.SIGKILL)
		_ = sysproc.Kill(e, syscall.SIGKILL)
	}

	term := &corev1.ContainerStateTerminated{StartedAt: started, FinishedAt: metav1.Now(), ContainerID: fmt.Sprintf("process://%d", pid)}
	term.ExitCode = exitCode(cmd, waitErr)
	switch {
	case oom:
		term.Reason, term.ExitCode = "OOMKilled", 137
	case term.ExitCode == 0:
		term.Reason = "Completed"
	default:
		term.Reason = "Error"
	}
	p.mu.Lock()
	p.setStateLocked(r, i, corev1.ContainerState{Terminated: term})
	p.mu.Unlock()
	return term
}

func exitCode(cmd *exec.Cmd, err error) int32 {
	if cmd.ProcessState == nil {
		if err != nil {
			return 128
		}
		return 0
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int32(ws.Signal())
	}
	return int32(cmd.ProcessState.ExitCode())
}

// ipPool hands out 127.X.Y.2–254 for one node.
type ipPool struct {
	base [2]byte
	used map[byte]bool
}

func (p *ipPool) addr(last byte) string {
	return net.IPv4(127, p.base[0], p.base[1], last).String()
}

func (p *ipPool) take() (string, error) {
	for b := 2; b < 255; b++ {
		if !p.used[byte(b)] {
			p.used[byte(b)] = true
			return p.addr(byte(b)), nil
		}
	}
	return "", errors.New("the test node has no pod IP left")
}

func (p *ipPool) give(ip string) {
	if parsed := net.ParseIP(ip).To4(); parsed != nil {
		delete(p.used, parsed[3])
	}
}

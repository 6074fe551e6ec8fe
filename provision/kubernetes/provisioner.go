package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	k8s "k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
)

// ErrNoAccess: the gateway's identity may not do what the provisioner
// needs in its namespace.
var ErrNoAccess = errors.New("kubernetes-provisioner: no access")

// Name is the Kubernetes provisioner's name, as kernelspecs give it in
// metadata.kernel_provisioner.provisioner_name and as its kernels'
// ProvisionerInfo names it.
const Name = "kubernetes-provisioner"

// Provisioner runs each kernel in a pod of its own.
type Provisioner struct {
	Client k8s.Interface
	// Config is Client's config, for the pods/exec subresource that runs
	// commands beside a kernel in its pod; without it a pod kernel runs
	// none (jupyter.ErrNoCommands).
	Config    *rest.Config
	Namespace string
	// Release scopes the pods: gateways of different releases (or
	// namespaces) never touch each other's pods.
	Release string
	Logger  *slog.Logger
	// Owned, set when replicas share one database, says whether a
	// replica owns the kernel or may still adopt it: Sweep leaves its pod
	// and Secret alone. nil (one gateway): every kernel Sweep is not told
	// to keep is an orphan.
	Owned func(ctx context.Context, kernelID string) (bool, error)
	// Replica, set when replicas share one database, is this replica's
	// id (a label value: up to 63 letters, digits, '-', '_' or '.'): the
	// pods and Secrets it creates carry it (LabelReplica). LiveReplica
	// says whether a replica of that id is live: Sweep leaves what a live
	// replica other than this one created, warm-pool pods and pods whose
	// lease is not taken yet included.
	Replica     string
	LiveReplica func(ctx context.Context, replicaID string) (bool, error)
	// WorkspaceClaim, when set, is the PersistentVolumeClaim the gateway
	// has mounted at WorkspaceRoot (its --workspace-root): a kernel whose
	// working directory is a folder under WorkspaceRoot (a context's
	// workspace) gets that folder of the claim mounted at the same path
	// (a subPath), and no other, so it reads and writes the files the
	// gateway serves.
	WorkspaceClaim string
	WorkspaceRoot  string

	cancel  context.CancelFunc
	factory informers.SharedInformerFactory

	mu    sync.Mutex
	procs map[string]*podProcess // by pod name
}

var (
	_ jupyter.Provisioner = (*Provisioner)(nil)
	_ jupyter.Adopter     = (*Provisioner)(nil)
)

// Capabilities: pods take no signals from the gateway (interrupts go by
// message), get no local limits or sandbox (the pod's resources and
// security context stand in), and are adopted again from the API server.
func (p *Provisioner) Capabilities(*kernelspecs.Spec) jupyter.Capabilities {
	return jupyter.Capabilities{Reconnect: true, OwnWorkspace: p.WorkspaceClaim != ""}
}

// workspaceMount is the folder of the workspace claim a kernel working in
// cwd mounts, relative to WorkspaceRoot ("" for none: no claim, or cwd
// not under the root).
func (p *Provisioner) workspaceMount(cwd string) string {
	if p.WorkspaceClaim == "" || p.WorkspaceRoot == "" || cwd == "" {
		return ""
	}
	rel, err := filepath.Rel(filepath.Clean(p.WorkspaceRoot), filepath.Clean(cwd))
	if err != nil || rel == "." || !filepath.IsLocal(rel) {
		return ""
	}
	return filepath.ToSlash(rel)
}

func (p *Provisioner) selector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{LabelManagedBy: managedBy, LabelRelease: p.Release})
}

func (p *Provisioner) log() *slog.Logger {
	if p.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.Logger
}

// Start checks the gateway may list pods and Secrets of its namespace and
// starts watching its kernel pods. It fails with ErrNoAccess, naming
// what was refused, when the identity lacks the Role.
func (p *Provisioner) Start(ctx context.Context) error {
	if p.Release == "" {
		p.Release = "kernelgate"
	}
	if p.WorkspaceClaim != "" {
		if errs := validation.IsDNS1123Subdomain(p.WorkspaceClaim); len(errs) > 0 {
			return fmt.Errorf("kubernetes-provisioner: workspace claim %q is not a claim name: %s", p.WorkspaceClaim, strings.Join(errs, "; "))
		}
		if !filepath.IsAbs(p.WorkspaceRoot) {
			return fmt.Errorf("kubernetes-provisioner: a workspace claim needs the absolute workspace root it is mounted at, not %q", p.WorkspaceRoot)
		}
	}
	if errs := validation.IsValidLabelValue(p.Replica); len(errs) > 0 {
		return fmt.Errorf("kubernetes-provisioner: replica id %q is not a label value: %s", p.Replica, strings.Join(errs, "; "))
	}
	opts := metav1.ListOptions{LabelSelector: p.selector().String(), Limit: 1}
	if _, err := p.Client.CoreV1().Pods(p.Namespace).List(ctx, opts); err != nil {
		return accessError("list pods", p.Namespace, err)
	}
	if _, err := p.Client.CoreV1().Secrets(p.Namespace).List(ctx, opts); err != nil {
		return accessError("list secrets", p.Namespace, err)
	}
	p.mu.Lock()
	p.procs = map[string]*podProcess{}
	p.mu.Unlock()
	wctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.factory = informers.NewSharedInformerFactoryWithOptions(p.Client, 0,
		informers.WithNamespace(p.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = p.selector().String() }))
	inf := p.factory.Core().V1().Pods().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.observe(obj, false) },
		UpdateFunc: func(_, obj any) { p.observe(obj, false) },
		DeleteFunc: func(obj any) { p.observe(obj, true) },
	})
	if err != nil {
		cancel()
		return err
	}
	p.factory.Start(wctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		p.Stop()
		return fmt.Errorf("kubernetes-provisioner: pods of namespace %s not listed in time", p.Namespace)
	}
	return nil
}

// Stop ends the watch. Pods are left as they are.
func (p *Provisioner) Stop() {
	if p.cancel != nil {
		p.cancel()
		p.factory.Shutdown()
	}
}

func accessError(what, ns string, err error) error {
	if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
		return fmt.Errorf("%w: cannot %s in namespace %s (the gateway's identity needs the Role of deploy/kubernetes/rbac.yaml): %v", ErrNoAccess, what, ns, err)
	}
	return fmt.Errorf("kubernetes-provisioner: %s in namespace %s: %w", what, ns, err)
}

// observe hands a pod event to the process of that pod, if any.
func (p *Provisioner) observe(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	p.mu.Lock()
	proc := p.procs[pod.Name]
	p.mu.Unlock()
	if proc != nil {
		proc.update(pod, deleted)
	}
}

// track hands the pod's events to proc from now on, and the pod as the
// informer has it now; it reports whether the informer has the pod (an
// event before track reached no one).
func (p *Provisioner) track(proc *podProcess) bool {
	p.mu.Lock()
	p.procs[proc.name] = proc
	p.mu.Unlock()
	obj, ok, _ := p.factory.Core().V1().Pods().Informer().GetStore().GetByKey(p.Namespace + "/" + proc.name)
	if ok {
		p.observe(obj, false)
	}
	return ok
}

// cachedPods reads the release's pods from the informer, which Start
// synced with the API server before returning.
func (p *Provisioner) cachedPods() (corelisters.PodNamespaceLister, error) {
	if p.factory == nil {
		return nil, fmt.Errorf("kubernetes-provisioner not started")
	}
	return p.factory.Core().V1().Pods().Lister().Pods(p.Namespace), nil
}

// tracked reports whether this provisioner serves the pod of that name
// (launching, running or adopted).
func (p *Provisioner) tracked(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.procs[name] != nil
}

func (p *Provisioner) untrack(proc *podProcess) {
	p.mu.Lock()
	if p.procs[proc.name] == proc {
		delete(p.procs, proc.name)
	}
	p.mu.Unlock()
}

// Launch creates the kernel's Secret and pod and returns once the pod
// runs with its IP, or fails at once with the reason the cluster gives.
func (p *Provisioner) Launch(ctx context.Context, req jupyter.LaunchRequest) (jupyter.Process, error) {
	if p.factory == nil {
		return nil, fmt.Errorf("%w: kubernetes-provisioner not started", jupyter.ErrStartFailed)
	}
	cfg, err := ParseConfig(req.Spec)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", jupyter.ErrStartFailed, err)
	}
	pp := podParams{
		Name: podName(req.KernelID), Namespace: p.Namespace, Release: p.Release,
		KernelID: req.KernelID, Kind: req.Kind, Spec: req.Spec, Config: cfg, Env: req.Env, Replica: p.Replica,
	}
	if sub := p.workspaceMount(req.Cwd); sub != "" {
		pp.Workspace = &workspaceVolume{Claim: p.WorkspaceClaim, SubPath: sub, Path: filepath.Clean(req.Cwd), Enter: !req.StartFresh}
		// The folders the gateway made for the kernel (DENO_DIR) are in
		// its workspace: reachable now.
		for name, dir := range req.DirEnv {
			if in, err := filepath.Rel(pp.Workspace.Path, dir); err == nil && filepath.IsLocal(in) {
				if pp.DirEnv == nil {
					pp.DirEnv = map[string]string{}
				}
				pp.DirEnv[name] = dir
			}
		}
	}
	if m, ok := req.Options.(memoryLimiter); ok {
		pp.MemoryBytes = m.MemoryLimit()
	}
	pod, err := buildPod(pp)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", jupyter.ErrStartFailed, err)
	}
	key := jupyter.NewKey()
	pods, secrets := p.Client.CoreV1().Pods(p.Namespace), p.Client.CoreV1().Secrets(p.Namespace)
	// Tracked before anything is created: this process's sweeps leave
	// the Secret and the pod alone from their creation on.
	proc := newPodProcess(p, pp.Name, req.Spec.Name, key)
	p.track(proc)
	// The Secret first, so the pod never waits for it; it is owned by
	// the pod once that exists.
	if _, err := secrets.Create(ctx, buildSecret(pp, key), metav1.CreateOptions{}); err != nil {
		p.untrack(proc)
		return nil, fmt.Errorf("%w: %w", jupyter.ErrStartFailed, accessError("create a secret", p.Namespace, err))
	}
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		p.untrack(proc)
		p.deleteObjectsSoon(pp.Name)
		return nil, fmt.Errorf("%w: %w", jupyter.ErrStartFailed, accessError("create a pod", p.Namespace, err))
	}
	proc.setUID(created.UID)
	owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: created.Name, UID: created.UID}}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": owner}})
	if _, err := secrets.Patch(ctx, pp.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		p.log().Warn("kernel secret not owned by its pod", "pod", pp.Name, "err", err)
	}
	if err := proc.waitRunning(ctx); err != nil {
		p.untrack(proc)
		p.deleteObjectsSoon(pp.Name)
		proc.finish("start failed", "", "")
		return nil, fmt.Errorf("%w: %w", jupyter.ErrStartFailed, err)
	}
	p.log().Debug("kernel pod running", "pod", pp.Name, "ip", proc.ConnInfo().IP)
	return proc, nil
}

// deleteTimeout bounds a delete made when no caller's context fits (a
// signal, a cleanup, a failed start whose context may have ended).
const deleteTimeout = 30 * time.Second

// deletePod deletes a kernel's pod, giving it grace seconds to stop; a pod
// already gone is no error.
func (p *Provisioner) deletePod(ctx context.Context, name string, grace int64) error {
	err := p.Client.CoreV1().Pods(p.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kubernetes-provisioner: delete pod %s: %w", name, err)
	}
	return nil
}

// deleteSecret deletes a kernel's Secret (the garbage collector would
// remove it with its pod; a cluster without one still ends up clean).
func (p *Provisioner) deleteSecret(ctx context.Context, name string) error {
	err := p.Client.CoreV1().Secrets(p.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kubernetes-provisioner: delete secret %s: %w", name, err)
	}
	return nil
}

// deleteObjectsSoon is deleteObjects on a context of its own, for a
// start whose context may have ended.
func (p *Provisioner) deleteObjectsSoon(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
	defer cancel()
	p.deleteObjects(ctx, name)
}

// deleteObjects deletes a kernel's pod at once and its Secret, logging
// what it could not delete.
func (p *Provisioner) deleteObjects(ctx context.Context, name string) {
	if err := p.deletePod(ctx, name, 0); err != nil {
		p.log().Warn("kernel pod not deleted", "pod", name, "err", err)
	}
	if err := p.deleteSecret(ctx, name); err != nil {
		p.log().Warn("kernel secret not deleted", "secret", name, "err", err)
	}
}

// podData is ProvisionerInfo.Data of a kernel pod.
type podData struct {
	Namespace string    `json:"namespace"`
	Pod       string    `json:"pod"`
	UID       types.UID `json:"uid"`
}

// Found is a running kernel pod of this release.
type Found struct {
	KernelID string
	Spec     string
	Kind     string
	Env      map[string]string
	Info     jupyter.ProvisionerInfo
}

// List returns the running kernel pods of the release, from the API
// server alone (through the informer's cache; the keys from their
// Secrets).
func (p *Provisioner) List(ctx context.Context) ([]Found, error) {
	pods, err := p.cachedPods()
	if err != nil {
		return nil, err
	}
	list, err := pods.List(p.selector())
	if err != nil {
		return nil, err
	}
	slices.SortFunc(list, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	var out []Found
	for _, pod := range list {
		if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" {
			continue
		}
		s, err := p.Client.CoreV1().Secrets(p.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			continue
		}
		f := Found{KernelID: pod.Labels[LabelKernelID], Spec: pod.Annotations[AnnotationSpec], Kind: pod.Labels[LabelKind]}
		_ = json.Unmarshal([]byte(pod.Annotations[AnnotationEnv]), &f.Env)
		f.Info = podInfo(podData{Namespace: pod.Namespace, Pod: pod.Name, UID: pod.UID},
			connInfo(pod.Status.PodIP, string(s.Data[SecretKey]), f.Spec))
		out = append(out, f)
	}
	return out, nil
}

// memoryLimiter is launch options that bound the kernel's memory (the
// gateway's --kernel-memory, or its kernelspec's): the pod gets that
// memory limit unless its kernelspec sets one.
type memoryLimiter interface {
	MemoryLimit() int64
}

// Adopt takes over the kernel pod info names, if it is the same pod (same
// UID) and runs.
func (p *Provisioner) Adopt(ctx context.Context, info jupyter.ProvisionerInfo) (jupyter.Process, error) {
	var d podData
	if info.Provisioner != Name || json.Unmarshal(info.Data, &d) != nil || d.Pod == "" {
		return nil, fmt.Errorf("%w: not a kernel pod", jupyter.ErrNotAdoptable)
	}
	if d.Namespace != p.Namespace {
		return nil, fmt.Errorf("%w: pod %s/%s is not in namespace %s", jupyter.ErrNotAdoptable, d.Namespace, d.Pod, p.Namespace)
	}
	pods, err := p.cachedPods()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", jupyter.ErrNotAdoptable, err)
	}
	pod, err := pods.Get(d.Pod)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: pod %s: %v", jupyter.ErrNotAdoptable, d.Pod, err)
	case pod.UID != d.UID:
		return nil, fmt.Errorf("%w: pod %s is another pod now", jupyter.ErrNotAdoptable, d.Pod)
	case pod.Labels[LabelRelease] != p.Release:
		return nil, fmt.Errorf("%w: pod %s belongs to release %q", jupyter.ErrNotAdoptable, d.Pod, pod.Labels[LabelRelease])
	case pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning:
		return nil, fmt.Errorf("%w: pod %s is %s", jupyter.ErrNotAdoptable, d.Pod, pod.Status.Phase)
	}
	proc := newPodProcess(p, d.Pod, info.Connection.KernelName, info.Connection.Key)
	proc.setUID(pod.UID)
	if !p.track(proc) {
		p.untrack(proc)
		proc.finish("not adopted", "", "")
		return nil, fmt.Errorf("%w: pod %s deleted meanwhile", jupyter.ErrNotAdoptable, d.Pod)
	}
	if err := proc.waitRunning(ctx); err != nil {
		p.untrack(proc)
		proc.finish("not adopted", "", "")
		return nil, fmt.Errorf("%w: %v", jupyter.ErrNotAdoptable, err)
	}
	return proc, nil
}

// Sweep deletes the kernel pods of the release whose kernel id keep does
// not hold, and Secrets left without their pod. The pods and Secrets this
// provisioner launched or adopted and still serves are never swept (a
// Secret and a pod being created included), so it may run at any time.
// With replicas (Owned set) a kernel another replica owns, or may still
// adopt, is not an orphan: its pod and Secret stay (so a replica must
// own a kernel before it creates its Secret), and so do those of a kernel
// whose ownership cannot be checked now.
func (p *Provisioner) Sweep(ctx context.Context, keep map[string]bool) (int, error) {
	cached, err := p.cachedPods()
	if err != nil {
		return 0, err
	}
	pods, err := cached.List(p.selector())
	if err != nil {
		return 0, err
	}
	live := map[string]bool{}
	n := 0
	others := map[string]bool{} // replica id: live, asked once per sweep
	for _, pod := range pods {
		if p.tracked(pod.Name) || keep[pod.Labels[LabelKernelID]] || p.owned(ctx, pod.Labels, others) {
			live[pod.Name] = true
			continue
		}
		p.log().Info("deleting a kernel pod no gateway serves", "pod", pod.Name)
		if err := p.deletePod(ctx, pod.Name, 0); err != nil {
			p.log().Warn("kernel pod not deleted", "pod", pod.Name, "err", err)
		}
		n++ // its Secret goes below, with every Secret of no live pod
	}
	secrets, err := p.Client.CoreV1().Secrets(p.Namespace).List(ctx, metav1.ListOptions{LabelSelector: p.selector().String()})
	if err != nil {
		return n, accessError("list secrets", p.Namespace, err)
	}
	for _, s := range secrets.Items {
		// A Secret listed was created after its pod's process was tracked
		// (Launch): asked now, tracked says whether it is this one's.
		if !live[s.Name] && !p.tracked(s.Name) && !p.owned(ctx, s.Labels, others) {
			if err := p.deleteSecret(ctx, s.Name); err != nil {
				p.log().Warn("kernel secret not deleted", "secret", s.Name, "err", err)
			}
		}
	}
	return n, nil
}

// owned says whether a replica owns the kernel of a pod or Secret of
// these labels or may adopt it, or whether a live replica other than
// this one created it (live caches the answers of LiveReplica). When
// that cannot be known it is taken as owned (a pod left is swept later,
// a pod deleted is a kernel lost).
func (p *Provisioner) owned(ctx context.Context, labels map[string]string, live map[string]bool) bool {
	if by := labels[LabelReplica]; by != "" && by != p.Replica && p.LiveReplica != nil {
		alive, asked := live[by]
		if !asked {
			var err error
			if alive, err = p.LiveReplica(ctx, by); err != nil {
				p.log().Warn("kernel pod kept: whether its replica is live is unknown", "replica", by, "err", err)
				alive = true
			}
			live[by] = alive
		}
		if alive {
			return true
		}
	}
	if p.Owned == nil {
		return false
	}
	owned, err := p.Owned(ctx, labels[LabelKernelID])
	if err != nil {
		p.log().Warn("kernel pod kept: its owner is unknown", "kernel", labels[LabelKernelID], "err", err)
		return true
	}
	return owned
}

//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"kernelgate/internal/pgtest"
	kubeprov "kernelgate/provision/kubernetes"
)

// workspaceClaim is the claim the replicas' --workspace-root stands
// for, as deploy/kubernetes names it; the test node mounts it for real.
const workspaceClaim = "kernelgate-workspaces"

// kubeReplicas are replicas of one release whose kernels are pods of
// one control plane, on one database and one workspace root (the claim).
type kubeReplicas struct {
	e       *kubeEnv
	db      string // the database's URL
	secret  string // the cluster secret's file
	wsRoot  string
	release string
	cmdline map[*gatewayProcess][]string // each replica's command line
}

// start starts a replica, with extra flags.
func (k *kubeReplicas) start(t *testing.T, extra ...string) *gatewayProcess {
	t.Helper()
	args := append([]string{"serve", "--port", "0", "--kernelspec-dir", k.e.specs, "--kubeconfig", k.e.kubecfg,
		"--release", k.release, "--state-url", k.db, "--cluster-secret-file", k.secret, "--runtime-dir", t.TempDir(),
		"--pool-size", "0", "--lease", "2s", "--workspace-root", k.wsRoot, "--kernel-workspace-claim", workspaceClaim}, extra...)
	g := startGatewayArgs(t, k.e.bin, args...)
	k.cmdline[g] = args
	return g
}

// rolling is the replica g, to be started again with its command line
// on its address; t owns the replicas started again.
func (k *kubeReplicas) rolling(t *testing.T, g *gatewayProcess) *rollingReplica {
	u, _ := url.Parse(g.url)
	return &rollingReplica{g: g, args: append(slices.Clip(k.cmdline[g]), "--port", u.Port()),
		start: func(args ...string) *gatewayProcess { return startGatewayArgs(t, k.e.bin, args...) }}
}

// kernelPod is what a context's kernel is: its pod, the pod's container
// restarts, and the kernel's process id in it.
type kernelPod struct {
	kernel   string
	uid      types.UID
	restarts int32
	pid      string
}

// kernelPods reads each context's kernel pod, asking its kernel for its
// process id through g.
func (k *kubeReplicas) kernelPods(t *testing.T, g *gatewayProcess, ids []string) map[string]kernelPod {
	t.Helper()
	out := map[string]kernelPod{}
	for _, id := range ids {
		var cm struct{ KernelID string }
		call(t, "GET", g.url+"api/contexts/"+id, nil, 200, &cm)
		pod := k.e.runningPod(t, cm.KernelID)
		kp := kernelPod{kernel: cm.KernelID, uid: pod.UID}
		for _, cs := range pod.Status.ContainerStatuses {
			kp.restarts += cs.RestartCount
		}
		var e execution
		call(t, "POST", g.url+"api/execute", map[string]any{"context": id, "code": "import os; os.getpid()"}, 200, &e)
		kp.pid = e.text()
		out[id] = kp
	}
	return out
}

// sameKernelPods checks that each context's kernel is the one of before:
// the same kernel, pod (never deleted) and process, no container restart.
func (k *kubeReplicas) sameKernelPods(t *testing.T, g *gatewayProcess, before map[string]kernelPod, deletions *podDeletions) {
	t.Helper()
	var ids []string
	for id := range before {
		ids = append(ids, id)
	}
	now := k.kernelPods(t, g, ids)
	for id, b := range before {
		if now[id] != b || b.pid == "" {
			t.Errorf("context %s: kernel %+v, before %+v: want the same kernel, pod and process, not restarted", id, now[id], b)
		}
		if deletions.has(b.uid) {
			t.Errorf("context %s: its kernel's pod %s was deleted", id, b.uid)
		}
	}
}

// lease is a kernel's row of the leases table, with its holder's URL.
type lease struct {
	Owner, URL string
	Epoch      int64
}

// leaseOf reads the kernel's lease from the store.
func (k *kubeReplicas) leaseOf(t *testing.T, kernel string) lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, k.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var l lease
	err = conn.QueryRow(ctx, `SELECT l.owner, coalesce(r.url, ''), l.epoch FROM leases l LEFT JOIN replicas r ON r.id = l.owner
		WHERE l.kernel_id = $1`, kernel).Scan(&l.Owner, &l.URL, &l.Epoch)
	if err != nil {
		t.Fatalf("lease of kernel %s: %v", kernel, err)
	}
	return l
}

// podDeletions records the pods of a release deleted from now on, by UID.
type podDeletions struct {
	mu      sync.Mutex
	deleted map[types.UID]string
}

func (k *kubeReplicas) watchDeletions(t *testing.T) *podDeletions {
	t.Helper()
	w, err := k.e.cp.Client.CoreV1().Pods(kubeNS).Watch(context.Background(), metav1.ListOptions{LabelSelector: kubeprov.LabelRelease + "=" + k.release})
	if err != nil {
		t.Fatal(err)
	}
	d := &podDeletions{deleted: map[types.UID]string{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if pod, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Deleted {
				d.mu.Lock()
				d.deleted[pod.UID] = pod.Name
				d.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		w.Stop()
		<-done
	})
	return d
}

func (d *podDeletions) has(uid types.UID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.deleted[uid]
	return ok
}

// releasePods counts the pods and Secrets of the release.
func (k *kubeReplicas) releasePods(t *testing.T) (int, int) {
	t.Helper()
	sel := metav1.ListOptions{LabelSelector: kubeprov.LabelRelease + "=" + k.release}
	pods, err := k.e.cp.Client.CoreV1().Pods(kubeNS).List(context.Background(), sel)
	if err != nil {
		t.Fatal(err)
	}
	secrets, err := k.e.cp.Client.CoreV1().Secrets(kubeNS).List(context.Background(), sel)
	if err != nil {
		t.Fatal(err)
	}
	return len(pods.Items), len(secrets.Items)
}

// TestKubernetesReplicas: three replica processes (the real binary, a
// real PostgreSQL) whose kernels are pods of one real control plane
// (internal/k8stest), its node mounting the workspace claim for real.
// They serve one set of kernels: a context created through A answers
// through B and C with one state, its kernel's websocket through C, a
// streamed run through B resumed through C; a file uploaded through B is
// read by the kernel pod (which mounts the context's folder of the
// claim) and downloaded through A. Every replica sweeps the release's
// pods while it runs, deleting an orphan and never a pod a live replica
// owns; a replica started beside them adopts none of their pods. The
// owner SIGKILLed mid-run: a survivor adopts the same pod, the context
// keeps its state. The owner SIGSTOPped past its lease, then SIGCONT:
// the lease moved on under a higher epoch and stays there, and no code
// runs on the kernel from the frozen one's client after it lost the
// lease (a counter in the kernel records the Jupyter session of the
// client of each execution), an execution it acknowledged included. A
// rolling restart (TestReplicasRollingRestartLosesNothing's front and
// counting clients, every replica SIGTERMed and started again in turn):
// no request fails, every acknowledged run is counted once, every
// context keeps its kernel pod and process. PostgreSQL stopped past the
// lease and started again while clients run (TestReplicasPostgresRestarted's
// clients and checks): each context keeps its owner, kernel pod and
// state. When the last replica stops, no pod or Secret of the release is
// left.
func TestKubernetesReplicas(t *testing.T) {
	wsRoot, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := startKubeEnvClaims(t, map[string]string{workspaceClaim: wsRoot})
	srv := pgtest.Start(t)
	k := &kubeReplicas{e: e, db: srv.CreateDB("kubereplicas"), secret: filepath.Join(t.TempDir(), "cluster-secret"), wsRoot: wsRoot, release: "replicas",
		cmdline: map[*gatewayProcess][]string{}}
	if err := os.WriteFile(k.secret, []byte(replicaSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	deletions := k.watchDeletions(t)
	tt := t // owns the replicas started again in the subtests
	gs := []*gatewayProcess{k.start(t), k.start(t), k.start(t)}
	waitReplicasLive(t, gs)
	a, b, c := gs[0], gs[1], gs[2]

	var agent struct {
		KernelID string `json:"kernelId"`
		Replica  string `json:"replica"`
	}
	var agentPod, notebookPod corev1.Pod
	var notebook string
	ok := t.Run("OneSetOfKernels", func(t *testing.T) {
		call(t, "POST", a.url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, &agent)
		if agent.Replica != replicaURL(a) {
			t.Errorf("the context created through A is %q's", agent.Replica)
		}
		agentPod = e.runningPod(t, agent.KernelID)
		if agentPod.Labels[kubeprov.LabelReplica] == "" {
			t.Errorf("the kernel pod names no replica: %v", agentPod.Labels)
		}
		if e := execute(t, b.url, "agent", "x = 41"); e.Process.Reason != "completed" {
			t.Fatalf("x = 41 through B: %+v", e)
		}
		if e := execute(t, c.url, "agent", "x + 1"); e.text() != "42" {
			t.Fatalf("x + 1 through C: %+v, want 42", e)
		}
		if got := wsExecute(t, c.url, agent.KernelID, "x * 2"); got != "82" {
			t.Errorf("x * 2 through C's websocket to the kernel: %q, want 82", got)
		}
		run := streamRun(t, b.url, "agent", "import time\nfor i in range(4):\n    print(i, flush=True)\n    time.sleep(0.2)", 1)
		evs := runEvents(t, c.url, run, 2)
		var out strings.Builder
		for _, ev := range evs {
			if ev.Type == "stdout" {
				out.WriteString(ev.Text)
			}
		}
		// After its first line: the rest, however the kernel split it.
		if last := evs[len(evs)-1]; last.Process.Reason != "completed" || !strings.HasSuffix(out.String(), "2\n3\n") || strings.Contains(out.String(), "0") {
			t.Errorf("the run started through B, resumed through C: stdout %q, end %+v; want 1 2 3, completed", out.String(), last)
		}
		// A Jupyter kernel of B's, with state.
		notebook = b.startKernel(t, "python3")
		notebookPod = e.runningPod(t, notebook)
		if got := wsExecute(t, b.url, notebook, "kept = 7; kept"); got != "7" {
			t.Fatalf("the notebook kernel through B: %q", got)
		}
	})
	if !ok {
		t.FailNow()
	}

	ok = t.Run("WorkspaceOnTheClaim", func(t *testing.T) {
		mounts := agentPod.Spec.Containers[0].VolumeMounts
		if len(mounts) != 1 || len(agentPod.Spec.Volumes) != 1 || agentPod.Spec.Volumes[0].PersistentVolumeClaim == nil ||
			agentPod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != workspaceClaim ||
			filepath.Join(wsRoot, mounts[0].SubPath) != mounts[0].MountPath {
			t.Errorf("the context's pod mounts %+v of %+v: want its folder of claim %s at the same path as under %s", mounts, agentPod.Spec.Volumes, workspaceClaim, wsRoot)
		}
		req, _ := http.NewRequest("PUT", b.url+"api/contexts/agent/files/data/in.txt", strings.NewReader("uploaded through B"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 201 {
			t.Fatalf("upload through B: %s", resp.Status)
		}
		ex := execute(t, c.url, "agent", "print(open('data/in.txt').read())\nwith open('out.txt', 'w') as f:\n    f.write('written in the kernel pod')")
		if got := strings.Join(ex.Logs.Stdout, ""); got != "uploaded through B\n" {
			t.Errorf("the kernel pod read %q (%+v), want the file uploaded through B", got, ex)
		}
		resp, err = http.Get(a.url + "api/contexts/agent/files/out.txt")
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(got) != "written in the kernel pod" {
			t.Errorf("download through A: %s %q, want the kernel pod's file", resp.Status, got)
		}
	})
	if !ok {
		t.FailNow()
	}

	ok = t.Run("EveryReplicaSweeps", func(t *testing.T) {
		// A kernel pod and Secret of the release that no replica created,
		// owns or may adopt: a replica's sweep deletes them while they
		// run, and leaves every pod a live replica owns.
		labels := map[string]string{kubeprov.LabelManagedBy: "kernelgate", kubeprov.LabelComponent: "kernel", kubeprov.LabelRelease: k.release,
			kubeprov.LabelKernelID: uuid.NewString(), kubeprov.LabelKind: "context", kubeprov.LabelReplica: "a-replica-long-gone"}
		name := "kernel-orphan"
		grace := int64(1)
		automount := false
		orphan := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &grace, AutomountServiceAccountToken: &automount,
			Containers: []corev1.Container{{Name: "kernel", Image: pythonImage, Command: []string{"sleep", "600"}}}}}
		ctx := context.Background()
		if _, err := e.cp.Client.CoreV1().Secrets(kubeNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Data: map[string][]byte{kubeprov.SecretKey: []byte("k")}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.cp.Client.CoreV1().Pods(kubeNS).Create(ctx, orphan, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitFor(t, "a replica's sweep to delete the orphan pod and its Secret", func() bool {
			_, errPod := e.cp.Client.CoreV1().Pods(kubeNS).Get(ctx, name, metav1.GetOptions{})
			_, errSecret := e.cp.Client.CoreV1().Secrets(kubeNS).Get(ctx, name, metav1.GetOptions{})
			return errPod != nil && errSecret != nil
		})
		for _, p := range []corev1.Pod{agentPod, notebookPod} {
			if deletions.has(p.UID) {
				t.Errorf("pod %s of a live replica's kernel was deleted", p.Name)
			}
		}
	})
	if !ok {
		t.FailNow()
	}

	ok = t.Run("StartBesideLiveReplicas", func(t *testing.T) {
		// A replica started while the others hold their kernels adopts
		// none of their pods: it leaves them to their owners, and serves
		// them by forwarding.
		d := k.start(t, "--pool-size", "1", "--pool-prewarm", "python")
		waitReplicasLive(t, []*gatewayProcess{a, b, c, d})
		if got := wsExecute(t, d.url, notebook, "kept"); got != "7" {
			t.Errorf("the notebook kernel through D: %q, want its state 7 from B", got)
		}
		var km struct{ Replica string }
		call(t, "GET", d.url+"api/kernels/"+notebook, nil, 200, &km)
		if km.Replica != replicaURL(b) {
			t.Errorf("the notebook kernel through D is %q's, want B's", km.Replica)
		}
		if logs := d.logs.String(); strings.Contains(logs, "kernel pod not adopted") || !strings.Contains(logs, `msg="kernel pods" adopted=0`) {
			t.Errorf("the new replica tried to adopt the pods the others hold:\n%s", logs)
		}

		// D's warm pod mounts its own workspace's folder only: a context
		// created through D starts a pod of its own, which mounts the
		// context's folder, rather than taking the warm one.
		waitFor(t, func() bool {
			resp, err := http.Get(d.url + "metrics")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return bytes.Contains(b, []byte(`kernelgate_pool_ready_kernels{spec="python3"} 1`))
		}, "D's warm pool has no ready kernel%s", func() []any { return []any{""} })
		known := map[string]bool{agent.KernelID: true, notebook: true}
		var warm corev1.Pod
		pods, _ := e.cp.Client.CoreV1().Pods(kubeNS).List(context.Background(), metav1.ListOptions{LabelSelector: kubeprov.LabelRelease + "=" + k.release})
		for _, p := range pods.Items {
			if id := p.Labels[kubeprov.LabelKernelID]; !known[id] && p.DeletionTimestamp == nil {
				warm = p
			}
		}
		var dc struct {
			KernelID string `json:"kernelId"`
		}
		call(t, "POST", d.url+"api/contexts", map[string]any{"id": "pooled", "language": "python"}, 201, &dc)
		// Neither taken nor thrown away: it still waits in the pool.
		now, err := e.cp.Client.CoreV1().Pods(kubeNS).Get(context.Background(), warm.Name, metav1.GetOptions{})
		if dc.KernelID == warm.Labels[kubeprov.LabelKernelID] || err != nil || now.UID != warm.UID || now.DeletionTimestamp != nil {
			t.Errorf("the context created through D took the warm pod %s (or stopped it), which mounts another folder than the context's", warm.Name)
		}
		req, _ := http.NewRequest("PUT", a.url+"api/contexts/pooled/files/note.txt", strings.NewReader("uploaded through A"))
		if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 201 {
			t.Fatalf("upload through A: %v %v", resp, err)
		}
		if ex := execute(t, d.url, "pooled", "print(open('note.txt').read())"); strings.Join(ex.Logs.Stdout, "") != "uploaded through A\n" {
			t.Errorf("the context's kernel through D read %+v, want the file uploaded through A", ex)
		}
		call(t, "DELETE", d.url+"api/contexts/pooled", nil, 204, nil)
		if err := d.kill(t, syscall.SIGTERM); err != nil {
			t.Errorf("D's exit: %v", err)
		}
		for _, p := range []corev1.Pod{agentPod, notebookPod} {
			if now := e.runningPod(t, p.Labels[kubeprov.LabelKernelID]); now.UID != p.UID {
				t.Errorf("kernel %s runs in pod %s, not %s", p.Labels[kubeprov.LabelKernelID], now.Name, p.Name)
			}
		}
	})
	if !ok {
		t.FailNow()
	}

	var survivors []*gatewayProcess
	ok = t.Run("OwnerKilledMidRun", func(t *testing.T) {
		owner, others := ownerOf(t, gs, "agent")
		if owner != a {
			t.Fatalf("the context's owner is %s, want A", owner.url)
		}
		survivors = others
		run := streamRun(t, b.url, "agent", "import time\nfor i in range(6):\n    print(i, flush=True)\n    time.sleep(0.5)", 1)
		if err := a.kill(t, syscall.SIGKILL); err == nil {
			t.Fatal("A exited cleanly after SIGKILL")
		}
		var cm struct{ Replica string }
		if !pollUntil(30*time.Second, func() bool {
			cm.Replica = ""
			_, err := tryCall(survivors[0].url+"api/contexts/agent", &cm)
			return err == nil && (cm.Replica == replicaURL(survivors[0]) || cm.Replica == replicaURL(survivors[1]))
		}) {
			t.Fatalf("no survivor took the context over within 30 s of its owner's death: %+v\n%s\n%s", cm, survivors[0].logs, survivors[1].logs)
		}
		if status, body := runEnd(survivors[1].url, run); status != 0 {
			t.Logf("the run in flight when its owner died: %d, last event %s", status, body)
		}
		for _, g := range survivors {
			if e := execute(t, g.url, "agent", "x + 1"); e.text() != "42" {
				t.Errorf("x + 1 through %s after the owner's death: %+v, want 42", g.url, e)
			}
		}
		if now := e.runningPod(t, agent.KernelID); now.UID != agentPod.UID {
			t.Errorf("the context's kernel runs in a new pod %s, not the adopted %s", now.Name, agentPod.Name)
		}
	})
	if !ok {
		t.FailNow()
	}

	t.Run("FrozenOwnerLetsGo", func(t *testing.T) {
		frozen, others := ownerOf(t, survivors, "agent")
		other := others[0]
		// Each execution appends the Jupyter session of the client that
		// sent it: each replica's connection to the kernel has its own.
		if e := execute(t, other.url, "agent", "log = []\ndef tick():\n    log.append(get_ipython().kernel.get_parent()['header']['session'])\n    return len(log)\ntick()"); e.text() != "1" {
			t.Fatalf("tick through the non-owner: %+v", e)
		}
		before := k.leaseOf(t, agent.KernelID)
		if before.URL != replicaURL(frozen) {
			t.Fatalf("lease %+v, want held by the owner %s", before, frozen.url)
		}
		acked := 1

		frozen.cmd.Process.Signal(syscall.SIGSTOP)
		t.Cleanup(func() { frozen.cmd.Process.Signal(syscall.SIGCONT) })
		var cm struct{ Replica string }
		if !pollUntil(30*time.Second, func() bool {
			cm.Replica = ""
			_, err := tryCall(other.url+"api/contexts/agent", &cm)
			return err == nil && cm.Replica == replicaURL(other)
		}) {
			t.Fatalf("the other survivor did not take the context over within 30 s of its owner freezing: %+v", cm)
		}
		after := k.leaseOf(t, agent.KernelID)
		if after.URL != replicaURL(other) || after.Epoch <= before.Epoch {
			t.Errorf("lease after the freeze %+v, want the other survivor's under an epoch above %d", after, before.Epoch)
		}
		// A request the frozen replica receives while stopped: it reads
		// it once it wakes, its lease lost.
		queued := sendRaw(t, frozen.url, "POST", "api/execute", map[string]any{"context": "agent", "code": "tick()"})
		if e := execute(t, other.url, "agent", "tick()"); e.text() != "2" {
			t.Fatalf("tick through the new owner: %+v, want 2", e)
		}
		acked++

		frozen.cmd.Process.Signal(syscall.SIGCONT)
		status, body := queued()
		var qe execution
		json.Unmarshal(body, &qe)
		indeterminate := 0
		if status == 200 && qe.text() != "" {
			acked++
		} else {
			indeterminate++
		}
		t.Logf("the request read by the woken replica: %d %s", status, body)
		waitFor(t, func() bool {
			cm.Replica = ""
			_, err := tryCall(frozen.url+"api/contexts/agent", &cm)
			return err == nil && cm.Replica == replicaURL(other)
		}, "the woken replica says the context is %q's, want %s's", func() []any { return []any{cm.Replica, other.url} })
		for _, g := range []*gatewayProcess{frozen, other} {
			var e execution
			call(t, "POST", g.url+"api/execute", map[string]any{"context": "agent", "code": "tick()"}, 200, &e)
			acked++
		}

		var e execution
		call(t, "POST", other.url+"api/execute", map[string]any{"context": "agent", "code": "import json\nprint(json.dumps(log))"}, 200, &e)
		var sessions []string
		if err := json.Unmarshal([]byte(strings.Join(e.Logs.Stdout, "")), &sessions); err != nil {
			t.Fatalf("the kernel's log: %v (%+v)", err, e)
		}
		if n := len(sessions); n < acked || n > acked+indeterminate {
			t.Errorf("the kernel counted %d executions, %d acknowledged and %d unknown: an execution counted twice or lost", n, acked, indeterminate)
		}
		frozenSession := sessions[0] // the first tick ran on the owner, before the freeze
		for i, s := range sessions[1:] {
			if s == frozenSession {
				t.Errorf("execution %d after the freeze came from the frozen replica's client (session %s): it acted for a kernel whose lease it lost", i+2, s)
			}
		}
		if end := k.leaseOf(t, agent.KernelID); end != after {
			t.Errorf("lease at the end %+v, want %+v: the woken replica took a term again", end, after)
		}
		if !strings.Contains(frozen.logs.String(), "kernel lease lost") {
			t.Errorf("the woken replica's log does not say it lost the lease")
		}
	})

	// The contexts of the clients below: two new, and the agent's.
	counted := []string{"counter-0", "counter-1", "agent"}
	ok = t.Run("RollingRestart", func(t *testing.T) {
		// A third replica again, in place of A; then clients counting
		// through a front over the three while each is SIGTERMed and
		// started again in turn.
		reps := []*rollingReplica{k.rolling(tt, k.start(tt)), k.rolling(tt, survivors[0]), k.rolling(tt, survivors[1])}
		survivors = nil
		defer func() {
			for _, r := range reps {
				survivors = append(survivors, r.g)
			}
		}()
		waitRollingLive(t, reps)
		fr := newFront(rollingURLs(reps))
		defer fr.close()
		fr.waitAll(t)
		for _, id := range counted[:2] {
			fr.call(t, "POST", "api/contexts", map[string]any{"id": id, "language": "python"}, nil)
		}
		before := k.kernelPods(t, reps[0].g, counted)
		t.Logf("the contexts' owners: %v", pgOwners(t, reps[0].g, counted))
		cs := startCounters(t, fr, counted)
		rollingRestart(t, reps, fr, cs, nil)
		cs.check(t)
		if t.Failed() {
			for i, r := range reps {
				t.Logf("replica %d:\n%s", i, r.g.logs)
			}
			t.FailNow()
		}
		k.sameKernelPods(t, reps[1].g, before, deletions)
		// The notebook kernel too: its pod, its state.
		if now := e.runningPod(t, notebook); now.UID != notebookPod.UID || deletions.has(notebookPod.UID) {
			t.Errorf("the notebook kernel runs in pod %s, not %s", now.Name, notebookPod.Name)
		}
		if got := wsExecute(t, reps[2].g.url, notebook, "kept"); got != "7" {
			t.Errorf("the notebook kernel after the rolling restart: %q, want its state 7", got)
		}
	})
	if !ok {
		t.FailNow()
	}

	ok = t.Run("PostgresRestarted", func(t *testing.T) {
		gs := survivors
		var urls []string
		for _, g := range gs {
			urls = append(urls, g.url)
		}
		was := pgOwners(t, gs[0], counted)
		before := k.kernelPods(t, gs[0], counted)
		cs := startPgClients(t, urls, counted)
		waitFor(t, func() bool { return cs.ackedSince(time.Time{}) >= 3 }, "the clients got fewer than 3 runs each before the outage", func() []any { return nil })
		down, up := pgOutage(t, srv, gs, was)
		cs.checkOutage(t, gs, was, down, up)
		k.sameKernelPods(t, gs[2], before, deletions)
	})
	if !ok {
		t.FailNow()
	}

	t.Run("NoPodLeftAfterTheLastReplica", func(t *testing.T) {
		for _, p := range []corev1.Pod{agentPod, notebookPod} {
			if deletions.has(p.UID) {
				t.Errorf("pod %s of a kernel a replica owned was deleted while its replicas ran", p.Name)
			}
		}
		for _, g := range survivors {
			g.stop(t)
		}
		e.waitFor(t, "no pod or Secret of the release left", func() bool {
			pods, secrets := k.releasePods(t)
			return pods == 0 && secrets == 0
		})
	})
}

// sendRaw writes a JSON request to the gateway at base on a connection of
// its own and returns a function that reads its answer: the request is
// in the gateway's socket before sendRaw returns, read or not.
func sendRaw(t *testing.T, base, method, path string, body any) func() (int, []byte) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	b, _ := json.Marshal(body)
	req := fmt.Sprintf("%s %s%s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", method, u.Path, path, u.Host, len(b))
	if _, err := conn.Write(append([]byte(req), b...)); err != nil {
		t.Fatal(err)
	}
	return func() (int, []byte) {
		t.Helper()
		conn.SetReadDeadline(time.Now().Add(2 * time.Minute))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("the answer to %s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, bytes.TrimSpace(out)
	}
}

// runEnd reads a run's events through the gateway at base until they end
// (a minute at most) and returns the answer's status and the last event.
func runEnd(base, run string) (int, string) {
	req, _ := http.NewRequest("GET", base+"api/runs/"+run+"/events?after=0", nil)
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	last := ""
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if !bytes.Contains(sc.Bytes(), []byte(`"keepalive"`)) {
			last = sc.Text()
		}
	}
	return resp.StatusCode, last
}

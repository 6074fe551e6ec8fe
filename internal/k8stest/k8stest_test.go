//go:build linux

package k8stest

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"kernelgate/internal/leakcheck"
)

const testImage = "kernelgate/test:1"

// cluster is one control plane and node for the tests that share them.
type cluster struct {
	cp   *ControlPlane
	node *Node
	ns   string
}

func startCluster(t *testing.T) *cluster {
	cp := Start(t)
	node := StartNode(t, cp, NodeConfig{
		Labels: map[string]string{"kernelgate.io/pool": "kernels"},
		Images: map[string]Image{testImage: {}},
		// Long enough for the status writes of a loaded machine to show
		// ErrImagePull before ImagePullBackOff replaces it.
		PullBackOff: 3 * time.Second,
	})
	cp.CreateNamespace(t, "k8stest")
	return &cluster{cp: cp, node: node, ns: "k8stest"}
}

func newPod(name string, command ...string) *corev1.Pod {
	grace := int64(1)
	automount := false
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &automount,
			Containers: []corev1.Container{{
				Name:    "main",
				Image:   testImage,
				Command: command,
				Env: []corev1.EnvVar{{
					Name:      "POD_IP",
					ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}},
				}},
			}},
		},
	}
}

func (c *cluster) create(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := c.cp.Client.CoreV1().Pods(c.ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	return out
}

func (c *cluster) wait(t *testing.T, name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	return WaitPod(t, c.cp.Client, c.ns, name, what, cond)
}

func running(p *corev1.Pod) bool { return p != nil && p.Status.Phase == corev1.PodRunning }

func waiting(reason string) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool {
		if p == nil || len(p.Status.ContainerStatuses) == 0 {
			return false
		}
		w := p.Status.ContainerStatuses[0].State.Waiting
		return w != nil && w.Reason == reason
	}
}

func terminated(p *corev1.Pod) *corev1.ContainerStateTerminated {
	if p == nil || len(p.Status.ContainerStatuses) == 0 {
		return nil
	}
	return p.Status.ContainerStatuses[0].State.Terminated
}

// pidOf reads the process id the node reports as the container's id.
func pidOf(t *testing.T, p *corev1.Pod) int {
	t.Helper()
	id := p.Status.ContainerStatuses[0].ContainerID
	pid, err := strconv.Atoi(strings.TrimPrefix(id, "process://"))
	if err != nil {
		t.Fatalf("container id %q: %v", id, err)
	}
	return pid
}

func environ(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		t.Fatalf("process %d: %v", pid, err)
	}
	out := map[string]string{}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			out[k] = v
		}
	}
	return out
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z"
}

func TestNode(t *testing.T) {
	c := startCluster(t)

	t.Run("RunningThenDeleted", func(t *testing.T) {
		c.create(t, newPod("sleeper", "sleep", "30"))
		pod := c.wait(t, "sleeper", "Running", running)
		pid := pidOf(t, pod)
		if !alive(pid) {
			t.Fatalf("pod Running but process %d not alive", pid)
		}
		if pod.Status.PodIP != c.node.PodIPBase() || !strings.HasPrefix(pod.Status.PodIP, "127.") {
			t.Errorf("pod IP %q, want the node's first, %s", pod.Status.PodIP, c.node.PodIPBase())
		}
		env := environ(t, pid)
		if env["POD_IP"] != pod.Status.PodIP {
			t.Errorf("POD_IP in the process = %q, pod IP %q", env["POD_IP"], pod.Status.PodIP)
		}
		if env["HOME"] == "" || env["HOME"] == os.Getenv("HOME") {
			t.Errorf("HOME = %q, want a folder of the pod's", env["HOME"])
		}
		if cwd, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd"); cwd != env["HOME"] {
			t.Errorf("cwd %q, HOME %q", cwd, env["HOME"])
		}
		if pgid, _ := syscall.Getpgid(pid); pgid != pid {
			t.Errorf("process group %d, want its own (%d)", pgid, pid)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.cp.Client.CoreV1().Pods(c.ns).Delete(ctx, "sleeper", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		c.wait(t, "sleeper", "deleted", func(p *corev1.Pod) bool { return p == nil })
		if alive(pid) {
			t.Errorf("pod deleted but process %d alive", pid)
		}
		// A new pod of the same name runs anew.
		c.create(t, newPod("sleeper", "sleep", "30"))
		if again := pidOf(t, c.wait(t, "sleeper", "Running", running)); again == pid || !alive(again) {
			t.Errorf("recreated pod: process %d (alive %v), the deleted one's was %d", again, alive(again), pid)
		}
	})

	t.Run("DeleteKillsWhatIgnoresTERM", func(t *testing.T) {
		c.create(t, newPod("stubborn", "sh", "-c", `trap "" TERM; sleep 30`))
		pid := pidOf(t, c.wait(t, "stubborn", "Running", running))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.cp.Client.CoreV1().Pods(c.ns).Delete(ctx, "stubborn", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		c.wait(t, "stubborn", "deleted", func(p *corev1.Pod) bool { return p == nil })
		if alive(pid) {
			t.Errorf("process %d, which ignores SIGTERM, alive after the grace period", pid)
		}
	})

	t.Run("RestartOnFailure", func(t *testing.T) {
		pod := newPod("crashy", "sh", "-c", "exit 2")
		pod.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
		c.create(t, pod)
		got := c.wait(t, "crashy", "restarted", func(p *corev1.Pod) bool {
			return waiting("CrashLoopBackOff")(p) && p.Status.ContainerStatuses[0].RestartCount >= 1
		})
		last := got.Status.ContainerStatuses[0].LastTerminationState.Terminated
		if last == nil || last.ExitCode != 2 || last.Reason != "Error" {
			t.Errorf("last termination %+v, want exit 2, Error", last)
		}
		if got.Status.Phase != corev1.PodRunning {
			t.Errorf("phase %s between restarts, want Running", got.Status.Phase)
		}
	})

	t.Run("EnvResolved", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := c.cp.Client.CoreV1().ConfigMaps(c.ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"mode": "fast"},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod := newPod("env", "sleep", "30")
		pod.Labels = map[string]string{"app": "kernel"}
		// The ServiceAccount admission plugin adds its token volume and mount.
		pod.Spec.AutomountServiceAccountToken = nil
		ctr := &pod.Spec.Containers[0]
		ctr.EnvFrom = []corev1.EnvFromSource{{Prefix: "CFG_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}}
		ctr.Env = append(ctr.Env,
			corev1.EnvVar{Name: "NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			corev1.EnvVar{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
			corev1.EnvVar{Name: "ADDR", Value: "$(POD_IP):5555 $$(POD_IP)"},
		)
		c.create(t, pod)
		pid := pidOf(t, c.wait(t, "env", "Running", running))
		env := environ(t, pid)
		ip := env["POD_IP"]
		want := map[string]string{"CFG_mode": "fast", "NAME": "env", "APP": "kernel", "ADDR": ip + ":5555 $(POD_IP)", "HOSTNAME": "env"}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("%s = %q, want %q", k, env[k], v)
			}
		}
	})

	t.Run("ExitCode", func(t *testing.T) {
		c.create(t, newPod("exit3", "sh", "-c", "exit 3"))
		pod := c.wait(t, "exit3", "Failed", func(p *corev1.Pod) bool { return p != nil && p.Status.Phase == corev1.PodFailed })
		term := terminated(pod)
		if term == nil || term.ExitCode != 3 || term.Reason != "Error" {
			t.Errorf("terminated = %+v, want exit 3, reason Error", term)
		}
		c.create(t, newPod("exit0", "true"))
		pod = c.wait(t, "exit0", "Succeeded", func(p *corev1.Pod) bool { return p != nil && p.Status.Phase == corev1.PodSucceeded })
		if term := terminated(pod); term == nil || term.ExitCode != 0 || term.Reason != "Completed" {
			t.Errorf("terminated = %+v, want exit 0, reason Completed", term)
		}
	})

	t.Run("UnknownImage", func(t *testing.T) {
		pod := newPod("noimage", "sleep", "30")
		pod.Spec.Containers[0].Image = "registry.invalid/nope:1"
		c.create(t, pod)
		got := c.wait(t, "noimage", "ErrImagePull", waiting("ErrImagePull"))
		if got.Status.Phase != corev1.PodPending {
			t.Errorf("phase %s, want Pending", got.Status.Phase)
		}
		got = c.wait(t, "noimage", "ImagePullBackOff", waiting("ImagePullBackOff"))
		if msg := got.Status.ContainerStatuses[0].State.Waiting.Message; !strings.Contains(msg, "registry.invalid/nope:1") {
			t.Errorf("message %q does not name the image", msg)
		}
	})

	t.Run("MissingSecret", func(t *testing.T) {
		pod := newPod("nosecret", "sleep", "30")
		pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, corev1.EnvVar{
			Name: "KEY",
			ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "later"}, Key: "key",
			}},
		})
		c.create(t, pod)
		got := c.wait(t, "nosecret", "CreateContainerConfigError", waiting("CreateContainerConfigError"))
		if msg := got.Status.ContainerStatuses[0].State.Waiting.Message; msg != `secret "later" not found` {
			t.Errorf("message %q", msg)
		}
		// Once the Secret exists the container starts with its value.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := c.cp.Client.CoreV1().Secrets(c.ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "later"}, Data: map[string][]byte{"key": []byte("s3cret")},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got = c.wait(t, "nosecret", "Running", running)
		if v := environ(t, pidOf(t, got))["KEY"]; v != "s3cret" {
			t.Errorf("KEY = %q, want the Secret's value", v)
		}
	})

	t.Run("SecretVolume", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := c.cp.Client.CoreV1().Secrets(c.ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "conn"}, Data: map[string][]byte{"connection.json": []byte(`{"key":"k"}`)},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod := newPod("volume", "sh", "-c", `test "$(cat /etc/kernelgate/connection.json)" = '{"key":"k"}'`)
		pod.Spec.Volumes = []corev1.Volume{{Name: "conn", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "conn"}}}}
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "conn", MountPath: "/etc/kernelgate", ReadOnly: true}}
		c.create(t, pod)
		got := c.wait(t, "volume", "finished", func(p *corev1.Pod) bool { return terminated(p) != nil })
		if got.Status.Phase != corev1.PodSucceeded {
			logs, _ := c.node.Logs(c.ns, "volume", "main")
			t.Errorf("the process did not read the Secret at its mountPath: %s\n%s", describePod(got), logs)
		}
	})

	t.Run("Unschedulable", func(t *testing.T) {
		pod := newPod("elsewhere", "sleep", "30")
		pod.Spec.NodeSelector = map[string]string{"kernelgate.io/pool": "gpu"}
		c.create(t, pod)
		got := c.wait(t, "elsewhere", "Unschedulable", func(p *corev1.Pod) bool {
			for _, cond := range podConditions(p) {
				if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
					return true
				}
			}
			return false
		})
		if got.Spec.NodeName != "" {
			t.Errorf("bound to %s", got.Spec.NodeName)
		}
		// A matching selector is bound.
		pod = newPod("matching", "sleep", "30")
		pod.Spec.NodeSelector = map[string]string{"kernelgate.io/pool": "kernels"}
		c.create(t, pod)
		if got := c.wait(t, "matching", "Running", running); got.Spec.NodeName != c.node.Name {
			t.Errorf("node %q, want %q", got.Spec.NodeName, c.node.Name)
		}
	})

	t.Run("OOMKilled", func(t *testing.T) {
		pod := newPod("hog", "/usr/bin/python3", "-c", "import time; b = b'x' * (256 << 20); time.sleep(30)")
		pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}
		c.create(t, pod)
		got := c.wait(t, "hog", "terminated", func(p *corev1.Pod) bool { return terminated(p) != nil })
		if term := terminated(got); term.Reason != "OOMKilled" || term.ExitCode != 137 || got.Status.Phase != corev1.PodFailed {
			t.Errorf("got %s, exit %d; want Failed, OOMKilled, 137", describePod(got), term.ExitCode)
		}
	})

	t.Run("WatchSeesTransitions", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
		defer cancel()
		w, err := c.cp.Client.CoreV1().Pods(c.ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=short"})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		// The process ends once the test creates "done" in its home.
		c.create(t, newPod("short", "sh", "-c", "while [ ! -e done ]; do sleep 0.05; done"))
		var phases []corev1.PodPhase
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				t.Fatalf("watch: %v", apierrors.FromObject(ev.Object))
			}
			pod := ev.Object.(*corev1.Pod)
			if len(phases) == 0 || phases[len(phases)-1] != pod.Status.Phase {
				phases = append(phases, pod.Status.Phase)
				if pod.Status.Phase == corev1.PodRunning {
					home := environ(t, pidOf(t, pod))["HOME"]
					if err := os.WriteFile(home+"/done", nil, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
				break
			}
		}
		want := []corev1.PodPhase{corev1.PodPending, corev1.PodRunning, corev1.PodSucceeded}
		if !equalPhases(phases, want) {
			t.Errorf("phases %v, want %v", phases, want)
		}
	})
}

func podConditions(p *corev1.Pod) []corev1.PodCondition {
	if p == nil {
		return nil
	}
	return p.Status.Conditions
}

func equalPhases(a, b []corev1.PodPhase) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestRoleBoundIdentity(t *testing.T) {
	cp := Start(t)
	cp.CreateNamespace(t, "kernels")
	cp.CreateNamespace(t, "other")
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader", Namespace: "kernels"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "get"}}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	client := kubernetes.NewForConfigOrDie(cp.ServiceAccount(t, "kernels", "gateway", role))
	if _, err := client.CoreV1().Pods("kernels").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list pods in its namespace: %v", err)
	}
	_, err := client.CoreV1().Pods("other").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("list pods elsewhere: %v, want Forbidden", err)
	}
	_, err = client.CoreV1().Secrets("kernels").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("list secrets, which the Role does not grant: %v, want Forbidden", err)
	}

	bare := kubernetes.NewForConfigOrDie(cp.ServiceAccount(t, "kernels", "nobody"))
	_, err = bare.CoreV1().Pods("kernels").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("list pods without the Role: %v, want Forbidden", err)
	}
}

// TestCyclesLeakNothing starts and stops a control plane and a node that
// ran a pod, twice, and checks no goroutine, file or process outlives them.
func TestCyclesLeakNothing(t *testing.T) {
	requireBinaries(t)
	before := leakcheck.Snapshot(t)
	var pids []int
	for i := 0; i < 2; i++ {
		t.Run("cycle", func(t *testing.T) {
			c := startCluster(t)
			c.create(t, newPod("sleeper", "sleep", "30"))
			pids = append(pids, pidOf(t, c.wait(t, "sleeper", "Running", running)))
			pids = append(pids, c.cp.etcd.cmd.Process.Pid, c.cp.apiserver.cmd.Process.Pid)
		})
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("process %d alive after its test", pid)
		}
	}
	leakcheck.Check(t, before)
}

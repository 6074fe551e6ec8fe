//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/websocket"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"kernelgate/internal/k8stest"
	kubeprov "kernelgate/provision/kubernetes"
)

// These tests run the real binary with kubernetes-provisioner against a
// real kube-apiserver and etcd (internal/k8stest), with a test node whose
// pods are local processes: kernel pods are real kernels. The gateway
// authenticates as a ServiceAccount bound to exactly the Role of
// deploy/kubernetes/rbac.yaml.

const (
	kubeNS      = "kernels"
	pythonImage = "kernelgate/kernel-python:test"
	denoImage   = "kernelgate/kernel-deno:test"
)

// deployRole is the Role of deploy/kubernetes/rbac.yaml.
func deployRole(t *testing.T) *rbacv1.Role {
	t.Helper()
	b, err := os.ReadFile("deploy/kubernetes/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("rbac.yaml: %v", err)
		}
		if meta.Kind == "Role" {
			var r rbacv1.Role
			if err := yaml.UnmarshalStrict([]byte(doc), &r); err != nil {
				t.Fatalf("rbac.yaml Role: %v", err)
			}
			return &r
		}
	}
	t.Fatal("rbac.yaml has no Role")
	return nil
}

// writeKubeconfig writes a kubeconfig for cfg, in namespace ns.
func writeKubeconfig(t *testing.T, cfg *rest.Config, ns string) string {
	t.Helper()
	c := clientcmdapi.NewConfig()
	c.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile, InsecureSkipTLSVerify: cfg.Insecure}
	c.AuthInfos["gw"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	c.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "gw", Namespace: ns}
	c.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*c, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// podSpecs writes kernelspecs whose kernels run as pods: python3 and deno
// as .kernels has them, and some that cannot start, each for its reason.
func podSpecs(t *testing.T, bin string) string {
	t.Helper()
	dir := t.TempDir()
	local := kernelsDir(t)
	write := func(name string, spec map[string]any, config map[string]any) {
		config["command"] = []string{bin, "kernel-entry"}
		md, _ := spec["metadata"].(map[string]any)
		if md == nil {
			md = map[string]any{}
		}
		md["kernel_provisioner"] = map[string]any{"provisioner_name": "kubernetes-provisioner", "config": config}
		spec["metadata"] = md
		b, _ := json.Marshal(spec)
		os.MkdirAll(filepath.Join(dir, name), 0o755)
		if err := os.WriteFile(filepath.Join(dir, name, "kernel.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(name string) map[string]any {
		b, err := os.ReadFile(filepath.Join(local, name, "kernel.json"))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		json.Unmarshal(b, &m)
		delete(m, "metadata") // no zygote preload: pods exec their kernel
		return m
	}
	write("python3", read("python3"), map[string]any{"image": pythonImage})
	write("deno", read("deno"), map[string]any{"image": denoImage})
	py := func() map[string]any { return read("python3") }
	write("bad-image", py(), map[string]any{"image": "kernelgate/no-such-image:1"})
	write("unschedulable", py(), map[string]any{"image": pythonImage, "node_selector": map[string]string{"gpu": "h100"}})
	write("config-error", py(), map[string]any{"image": pythonImage, "secret_env": map[string]string{"API_TOKEN": "missing-secret/token"}})
	crash := py()
	crash["argv"] = []string{"/bin/sh", "-c", "echo the kernel cannot start >&2; exit 3"}
	write("crash", crash, map[string]any{"image": pythonImage})
	write("oom", py(), map[string]any{"image": pythonImage, "resources": map[string]any{"limits": map[string]string{"memory": "16Mi"}}})
	return dir
}

type kubeEnv struct {
	cp       *k8stest.ControlPlane
	bin      string
	specs    string
	kubecfg  string
	noAccess string
}

func startKubeEnv(t *testing.T) *kubeEnv { return startKubeEnvClaims(t, nil) }

// startKubeEnvClaims is startKubeEnv with a node that mounts these claims
// (k8stest.NodeConfig.Claims).
func startKubeEnvClaims(t *testing.T, claims map[string]string) *kubeEnv {
	cp := k8stest.Start(t)
	k8stest.StartNode(t, cp, k8stest.NodeConfig{
		Images: map[string]k8stest.Image{pythonImage: {}, denoImage: {}},
		Claims: claims,
	})
	cp.CreateNamespace(t, kubeNS)
	role := deployRole(t)
	role.Namespace = kubeNS
	cfg := cp.ServiceAccount(t, kubeNS, "kernelgate", role)
	none := cp.ServiceAccount(t, kubeNS, "nobody")
	bin := buildBinary(t)
	return &kubeEnv{cp: cp, bin: bin, specs: podSpecs(t, bin),
		kubecfg: writeKubeconfig(t, cfg, kubeNS), noAccess: writeKubeconfig(t, none, kubeNS)}
}

// gateway runs kernelgate serve with the pod kernelspecs.
func (e *kubeEnv) gateway(t *testing.T, release string, args ...string) *gatewayProcess {
	t.Helper()
	args = append([]string{"serve", "--port", "0", "--state-dir", "", "--kernelspec-dir", e.specs, "--kubeconfig", e.kubecfg,
		"--release", release, "--pool-size", "1", "--pool-prewarm", "python"}, args...)
	return startGatewayArgs(t, e.bin, args...)
}

func (p *gatewayProcess) call(t *testing.T, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, strings.TrimSuffix(p.url, "/")+path, r)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (p *gatewayProcess) startKernel(t *testing.T, name string) string {
	t.Helper()
	code, b := p.call(t, "POST", "/api/kernels", map[string]string{"name": name})
	if code != http.StatusCreated {
		t.Fatalf("start %s: %d %s\n%s", name, code, b, p.logs)
	}
	var k struct{ ID string }
	json.Unmarshal(b, &k)
	return k.ID
}

// kernelPods lists the pods and Secrets of a kernel.
func (e *kubeEnv) kernelPods(t *testing.T, id string) ([]corev1.Pod, int) {
	t.Helper()
	sel := metav1.ListOptions{LabelSelector: kubeprov.LabelKernelID + "=" + id}
	pods, err := e.cp.Client.CoreV1().Pods(kubeNS).List(context.Background(), sel)
	if err != nil {
		t.Fatal(err)
	}
	secrets, err := e.cp.Client.CoreV1().Secrets(kubeNS).List(context.Background(), sel)
	if err != nil {
		t.Fatal(err)
	}
	return pods.Items, len(secrets.Items)
}

// waitFor waits until ok holds, checking it again at each change of a
// pod or Secret of the namespace (a watch of each), for a minute.
func (e *kubeEnv) waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pods, err := e.cp.Client.CoreV1().Pods(kubeNS).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pods.Stop()
	secrets, err := e.cp.Client.CoreV1().Secrets(kubeNS).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer secrets.Stop()
	for !ok() {
		select {
		case <-pods.ResultChan():
		case <-secrets.ResultChan():
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// runningPod is the kernel's running pod.
func (e *kubeEnv) runningPod(t *testing.T, id string) corev1.Pod {
	t.Helper()
	var out corev1.Pod
	e.waitFor(t, "a running pod of kernel "+id, func() bool {
		pods, _ := e.kernelPods(t, id)
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				out = p
				return true
			}
		}
		return false
	})
	return out
}

// mustID is the id of a created context.
func mustID(t *testing.T, body []byte) string {
	t.Helper()
	var c struct{ ID string }
	if err := json.Unmarshal(body, &c); err != nil || c.ID == "" {
		t.Fatalf("no id in %s", body)
	}
	return c.ID
}

// kws is a Jupyter websocket client of one kernel.
type kws struct {
	t       *testing.T
	c       *websocket.Conn
	session string
	// streamed, when set, is closed at the first stream output.
	streamed chan struct{}
}

type kmsg struct {
	Header       map[string]any `json:"header"`
	ParentHeader map[string]any `json:"parent_header"`
	Metadata     map[string]any `json:"metadata"`
	Content      map[string]any `json:"content"`
	Channel      string         `json:"channel"`
	Buffers      []any          `json:"buffers"`
}

func (p *gatewayProcess) dial(t *testing.T, id string) *kws {
	t.Helper()
	u := "ws" + strings.TrimPrefix(strings.TrimSuffix(p.url, "/"), "http") + "/api/kernels/" + id + "/channels?session_id=" + uuid.NewString()
	c, _, err := websocket.DefaultDialer.Dial(u, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", u, err)
	}
	t.Cleanup(func() { c.Close() })
	return &kws{t: t, c: c, session: uuid.NewString()}
}

func (w *kws) send(channel, typ string, content any) string {
	id := uuid.NewString()
	m := map[string]any{
		"header":        map[string]any{"msg_id": id, "msg_type": typ, "session": w.session, "username": "test", "version": "5.3", "date": time.Now().UTC().Format(time.RFC3339)},
		"parent_header": map[string]any{}, "metadata": map[string]any{}, "content": content, "channel": channel, "buffers": []any{},
	}
	if err := w.c.WriteJSON(m); err != nil {
		w.t.Fatal(err)
	}
	return id
}

func (w *kws) read(d time.Duration) kmsg {
	w.t.Helper()
	w.c.SetReadDeadline(time.Now().Add(d))
	var m kmsg
	if err := w.c.ReadJSON(&m); err != nil {
		w.t.Fatalf("websocket read: %v", err)
	}
	return m
}

// execute runs code; onInput answers input requests. It returns the
// text of stream and result output and the reply's status.
func (w *kws) execute(code string, onInput func(prompt string) string) (string, string) {
	w.t.Helper()
	id := w.send("shell", "execute_request", map[string]any{"code": code, "silent": false, "store_history": true,
		"user_expressions": map[string]any{}, "allow_stdin": onInput != nil, "stop_on_error": true})
	var out strings.Builder
	status, idle := "", false
	for status == "" || !idle {
		m := w.read(90 * time.Second)
		if m.ParentHeader["msg_id"] != id {
			continue
		}
		switch m.Header["msg_type"] {
		case "stream":
			out.WriteString(fmt.Sprint(m.Content["text"]))
			if w.streamed != nil {
				close(w.streamed)
				w.streamed = nil
			}
		case "execute_result":
			data, _ := m.Content["data"].(map[string]any)
			out.WriteString(fmt.Sprint(data["text/plain"]))
		case "error":
			out.WriteString(fmt.Sprint(m.Content["ename"]))
		case "input_request":
			w.send("stdin", "input_reply", map[string]any{"value": onInput(fmt.Sprint(m.Content["prompt"]))})
		case "status":
			idle = m.Content["execution_state"] == "idle"
		case "execute_reply":
			status = fmt.Sprint(m.Content["status"])
		}
	}
	return out.String(), status
}

// waitState reads until a status without parent says state.
func (w *kws) waitState(state string) {
	w.t.Helper()
	for {
		m := w.read(90 * time.Second)
		if m.Header["msg_type"] == "status" && m.Content["execution_state"] == state {
			return
		}
	}
}

func TestKubernetes(t *testing.T) {
	e := startKubeEnv(t)

	t.Run("Kernels", func(t *testing.T) {
		gw := e.gateway(t, "kernels")
		for _, lang := range []struct{ spec, print, sleep, input string }{
			{"python3", "x = 6 * 7\nprint(x)", "import time\nprint('sleeping', flush=True)\nwhile True:\n    time.sleep(0.05)", "print('got', input('name? '))"},
			{"deno", "let x = 6 * 7; console.log(x)", "console.log('spinning'); while (true) {}", "console.log('got', prompt('name?'))"},
		} {
			t.Run(lang.spec, func(t *testing.T) {
				id := gw.startKernel(t, lang.spec)
				pod := e.runningPod(t, id)
				if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
					t.Errorf("the kernel pod mounts a service account token")
				}
				w := gw.dial(t, id)
				if out, st := w.execute(lang.print, nil); st != "ok" || !strings.Contains(out, "42") {
					t.Fatalf("execute: %q %s", out, st)
				}
				if out, st := w.execute(lang.input, func(string) string { return "kernelgate" }); st != "ok" || !strings.Contains(out, "got kernelgate") {
					t.Errorf("input(): %q %s", out, st)
				}
				// Interrupt (by message: a pod takes no signal from the gateway).
				done := make(chan string, 1)
				started := make(chan struct{})
				w.streamed = started
				go func() {
					_, st := w.execute(lang.sleep, nil)
					done <- st
				}()
				select {
				case <-started:
				case <-time.After(time.Minute):
					t.Fatal("the long run printed nothing")
				}
				if code, b := gw.call(t, "POST", "/api/kernels/"+id+"/interrupt", nil); code != http.StatusNoContent {
					t.Fatalf("interrupt: %d %s", code, b)
				}
				select {
				case st := <-done:
					if st != "error" {
						t.Errorf("interrupted run's reply status %q, want error", st)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("the interrupt did not stop the run")
				}

				// Restart: a new pod, state gone.
				if code, b := gw.call(t, "POST", "/api/kernels/"+id+"/restart", nil); code != http.StatusOK {
					t.Fatalf("restart: %d %s", code, b)
				}
				after := e.runningPod(t, id)
				if after.Name == pod.Name {
					t.Errorf("restart kept pod %s", pod.Name)
				}
				w = gw.dial(t, id)
				if out, _ := w.execute(lang.print, nil); !strings.Contains(out, "42") {
					t.Errorf("after restart: %q", out)
				}

				// The kernel process killed: restarting, then a working kernel.
				pid, _ := strconv.Atoi(strings.TrimPrefix(after.Status.ContainerStatuses[0].ContainerID, "process://"))
				if pid <= 0 {
					t.Fatalf("no process of pod %s", after.Name)
				}
				syscall.Kill(pid, syscall.SIGKILL)
				w.waitState("restarting")
				w.waitState("idle")
				if out, st := w.execute(lang.print, nil); st != "ok" || !strings.Contains(out, "42") {
					t.Errorf("after the kill: %q %s", out, st)
				}

				if code, b := gw.call(t, "DELETE", "/api/kernels/"+id, nil); code != http.StatusNoContent {
					t.Fatalf("delete: %d %s", code, b)
				}
				e.waitFor(t, "the pods and Secrets of kernel "+id+" gone", func() bool {
					pods, secrets := e.kernelPods(t, id)
					return len(pods) == 0 && secrets == 0
				})
			})
		}
	})

	t.Run("Contexts", func(t *testing.T) {
		gw := e.gateway(t, "contexts")
		code, b := gw.call(t, "POST", "/api/contexts", map[string]string{"language": "python"})
		if code != http.StatusCreated {
			t.Fatalf("context: %d %s", code, b)
		}
		var c struct{ ID, KernelID string }
		json.Unmarshal(b, &c)
		run := func(body map[string]any) string {
			t.Helper()
			code, b := gw.call(t, "POST", "/api/execute", body)
			if code != http.StatusOK {
				t.Fatalf("execute %v: %d %s\n%s", body, code, b, gw.logs)
			}
			return string(b)
		}
		run(map[string]any{"code": "y = 5", "context": c.ID})
		if out := run(map[string]any{"code": "print(y * 2)", "context": c.ID}); !strings.Contains(out, `10\n`) {
			t.Errorf("context run: %s", out)
		}
		// An isolated run from a warm pod.
		if out := run(map[string]any{"code": "import os; print('pid', os.getpid())", "isolated": true}); !strings.Contains(out, "pid") {
			t.Errorf("isolated run: %s", out)
		}
		pods, _ := e.cp.Client.CoreV1().Pods(kubeNS).List(context.Background(), metav1.ListOptions{LabelSelector: kubeprov.LabelRelease + "=contexts," + kubeprov.LabelKind + "=context"})
		if len(pods.Items) == 0 {
			t.Errorf("no context pods in release contexts")
		}
		if code, b := gw.call(t, "DELETE", "/api/contexts/"+c.ID, nil); code != http.StatusNoContent {
			t.Errorf("delete context: %d %s", code, b)
		}
	})

	t.Run("StartFailures", func(t *testing.T) {
		gw := e.gateway(t, "failures", "--pool-size", "0")
		for spec, want := range map[string]string{
			"bad-image":     "ErrImagePull",
			"unschedulable": "Unschedulable",
			"config-error":  "CreateContainerConfigError",
			"crash":         "exit code 3",
			"oom":           "OOMKilled",
		} {
			t0 := time.Now()
			code, b := gw.call(t, "POST", "/api/kernels", map[string]string{"name": spec})
			if code != http.StatusServiceUnavailable || !strings.Contains(string(b), want) {
				t.Errorf("%s: %d %s, want 503 with %q", spec, code, b, want)
			}
			t.Logf("%s failed after %v: %s", spec, time.Since(t0).Round(time.Millisecond), b)
		}
		e.waitFor(t, "no pods left of failed starts", func() bool {
			pods, _ := e.cp.Client.CoreV1().Pods(kubeNS).List(context.Background(), metav1.ListOptions{LabelSelector: kubeprov.LabelRelease + "=failures"})
			return len(pods.Items) == 0
		})
	})

	t.Run("MaxKernelsAndCulling", func(t *testing.T) {
		gw := e.gateway(t, "limits", "--pool-size", "0", "--max-kernels", "1", "--cull-idle-timeout", "2s", "--cull-interval", "500ms")
		id := gw.startKernel(t, "python3")
		if code, b := gw.call(t, "POST", "/api/kernels", map[string]string{"name": "python3"}); code == http.StatusCreated {
			t.Errorf("a second kernel past --max-kernels 1: %d %s", code, b)
		}
		e.waitFor(t, "the idle kernel's pod and Secret gone", func() bool {
			pods, secrets := e.kernelPods(t, id)
			return len(pods) == 0 && secrets == 0
		})
		if code, b := gw.call(t, "GET", "/api/kernels/"+id, nil); code != http.StatusNotFound {
			t.Errorf("culled kernel still listed: %d %s", code, b)
		}
	})

	t.Run("WithoutRole", func(t *testing.T) {
		cmd := exec.Command(e.bin, "serve", "--port", "0", "--state-dir", "", "--kernelspec-dir", e.specs, "--kubeconfig", e.noAccess)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "cannot list pods in namespace "+kubeNS) || !strings.Contains(string(out), "deploy/kubernetes/rbac.yaml") {
			t.Errorf("a gateway without its Role: %v\n%s", err, out)
		}
	})

	t.Run("ReadoptAfterGatewayDied", func(t *testing.T) {
		// A gateway of another release, whose pod nothing here may touch.
		bystander := e.gateway(t, "bystander", "--pool-size", "0")
		theirs := e.runningPod(t, bystander.startKernel(t, "python3"))

		gw := e.gateway(t, "readopt", "--pool-size", "0")
		id := gw.startKernel(t, "python3")
		pod := e.runningPod(t, id)
		w := gw.dial(t, id)
		w.execute("kept = 'state of the kernel'", nil)
		w.c.Close()
		// A context's kernel: its record dies with the gateway, so its pod
		// is deleted by the next one.
		code, b := gw.call(t, "POST", "/api/contexts", map[string]string{"language": "python"})
		if code != http.StatusCreated {
			t.Fatalf("context: %d %s", code, b)
		}
		if code, b := gw.call(t, "POST", "/api/execute", map[string]any{"code": "1", "context": mustID(t, b)}); code != http.StatusOK {
			t.Fatalf("context run: %d %s", code, b)
		}
		ctxPods := metav1.ListOptions{LabelSelector: kubeprov.LabelRelease + "=readopt," + kubeprov.LabelKind + "=context"}
		if l, _ := e.cp.Client.CoreV1().Pods(kubeNS).List(context.Background(), ctxPods); len(l.Items) == 0 {
			t.Fatal("no context pod")
		}
		gw.cmd.Process.Kill()
		<-gw.done

		// Another gateway of the release, no local state: the pod is adopted.
		other := e.gateway(t, "readopt", "--pool-size", "0", "--runtime-dir", t.TempDir())
		code, b = other.call(t, "GET", "/api/kernels/"+id, nil)
		if code != http.StatusOK {
			t.Fatalf("kernel %s not adopted: %d %s\n%s", id, code, b, other.logs)
		}
		if out, _ := other.dial(t, id).execute("print(kept)", nil); !strings.Contains(out, "state of the kernel") {
			t.Errorf("adopted kernel lost its state: %q", out)
		}
		if now := e.runningPod(t, id); now.UID != pod.UID {
			t.Errorf("the kernel runs in a new pod %s, not %s", now.Name, pod.Name)
		}
		e.waitFor(t, "the dead gateway's context pod deleted", func() bool {
			l, _ := e.cp.Client.CoreV1().Pods(kubeNS).List(context.Background(), ctxPods)
			return len(l.Items) == 0
		})
		if p, err := e.cp.Client.CoreV1().Pods(kubeNS).Get(context.Background(), theirs.Name, metav1.GetOptions{}); err != nil || p.UID != theirs.UID || p.DeletionTimestamp != nil {
			t.Errorf("the pod of another release was touched: %v", err)
		}
	})
}

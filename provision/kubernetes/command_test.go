//go:build linux

package kubernetes

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"kernelgate/internal/k8stest"
	"kernelgate/internal/leakcheck"
	"kernelgate/internal/testkernels"
	"kernelgate/jupyter"
)

// These tests run commands beside a real ipykernel kernel in a pod of the
// control-plane harness (internal/k8stest), as the gateway's identity
// bound to exactly the Role of deploy/kubernetes/rbac.yaml: the command
// reaches the pod through pods/exec, which that Role must grant.

const testImage = "kernelgate/kernel-python:test"

// deployRole is the Role of deploy/kubernetes/rbac.yaml.
func deployRole(t *testing.T) *rbacv1.Role {
	t.Helper()
	b, err := os.ReadFile("../../deploy/kubernetes/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		if meta.Kind == "Role" {
			var r rbacv1.Role
			if err := yaml.UnmarshalStrict([]byte(doc), &r); err != nil {
				t.Fatal(err)
			}
			return &r
		}
	}
	t.Fatal("rbac.yaml has no Role")
	return nil
}

// podKernel is a python3 kernel running in a pod of a test cluster.
type podKernel struct {
	cp   *k8stest.ControlPlane
	p    *Provisioner
	proc *podProcess
	pid  int    // the kernel's process, on this host
	cwd  string // its working directory
}

func startPodKernel(t *testing.T) *podKernel {
	cp := k8stest.Start(t)
	k8stest.StartNode(t, cp, k8stest.NodeConfig{Images: map[string]k8stest.Image{testImage: {}}})
	cp.CreateNamespace(t, ns)
	role := deployRole(t)
	role.Namespace = ns
	cfg := cp.ServiceAccount(t, ns, "kernelgate", role)
	p := &Provisioner{Client: k8s.NewForConfigOrDie(cfg), Config: cfg, Namespace: ns, Release: "commands"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)

	spec := *testkernels.Spec(t, "python3")
	spec.Metadata = map[string]any{"kernel_provisioner": map[string]any{
		"provisioner_name": "kubernetes-provisioner",
		"config":           map[string]any{"image": testImage, "command": []string{os.Args[0], "kernel-entry"}},
	}}
	proc, err := p.Launch(ctx, jupyter.LaunchRequest{KernelID: "5e1f0c2a-9d7b-4c1e-8f3a-2b6d4e8a0c11", Spec: &spec, Kind: "context"})
	if err != nil {
		t.Fatal(err)
	}
	pp := proc.(*podProcess)
	t.Cleanup(func() { pp.Cleanup() })
	pod, err := cp.Client.CoreV1().Pods(ns).Get(ctx, pp.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "process://"))
	cwd, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd")
	if err != nil {
		t.Fatalf("the kernel's process %d: %v", pid, err)
	}
	return &podKernel{cp: cp, p: p, proc: pp, pid: pid, cwd: cwd}
}

// output reads a command's stdout and stderr to their ends and returns
// them with its exit code.
func output(t *testing.T, c jupyter.Command) (stdout, stderr string, code int) {
	t.Helper()
	errc := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(c.Stderr())
		errc <- string(b)
	}()
	b, _ := io.ReadAll(c.Stdout())
	stderr = <-errc
	c.Stdout().Close()
	c.Stderr().Close()
	select {
	case <-c.Done():
	case <-time.After(time.Minute):
		t.Fatal("the command's output ended but the command did not")
	}
	return string(b), stderr, c.ExitCode()
}

func (k *podKernel) start(t *testing.T, req jupyter.CommandRequest) jupyter.Command {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := k.proc.StartCommand(ctx, req)
	if err != nil {
		t.Fatalf("StartCommand %v: %v", req.Argv, err)
	}
	return c
}

// firstLine reads the first line of r (the rest is left to read).
func firstLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("first line: %q %v", line, err)
	}
	return strings.TrimSpace(line)
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

// waitFor polls cond until it holds, failing the test after 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("waited 30 s for %s", what)
		}
	}
}

func TestPodCommands(t *testing.T) {
	k := startPodKernel(t)

	t.Run("InThePod", func(t *testing.T) {
		// The pod's env and the kernel's cwd, the request's env laid over
		// (a value with a newline, a backslash and a control byte kept);
		// stdout and stderr apart; the exit code.
		c := k.start(t, jupyter.CommandRequest{
			Argv: []string{"/bin/sh", "-c", `echo "$HOSTNAME $KERNELGATE_KERNEL_NAME"; printf '%s|' "$GREETING"; echo; pwd; echo oops >&2; exit 3`},
			Env:  map[string]string{"GREETING": "two\nlines \\ and \x1b"},
		})
		if c.Stdin() != nil {
			t.Errorf("a command without Stdin has an input")
		}
		out, errOut, code := output(t, c)
		if want := k.proc.name + " python3\ntwo\nlines \\ and \x1b|\n" + k.cwd + "\n"; out != want {
			t.Errorf("stdout %q, want %q", out, want)
		}
		if errOut != "oops\n" {
			t.Errorf("stderr %q, want %q", errOut, "oops\n")
		}
		if code != 3 {
			t.Errorf("exit code %d, want 3", code)
		}
	})

	t.Run("DirAndPathFirst", func(t *testing.T) {
		dir, bin := t.TempDir(), t.TempDir()
		if err := os.WriteFile(filepath.Join(bin, "hello-tool"), []byte("#!/bin/sh\necho hello from $(pwd)\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		out, _, code := output(t, k.start(t, jupyter.CommandRequest{Argv: []string{"hello-tool"}, Dir: dir, PathFirst: []string{bin}}))
		if out != "hello from "+dir+"\n" || code != 0 {
			t.Errorf("hello-tool: %q exit %d", out, code)
		}
	})

	t.Run("NoProgram", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := k.proc.StartCommand(ctx, jupyter.CommandRequest{Argv: []string{"no-such-program"}})
		if !errors.Is(err, jupyter.ErrNoProgram) {
			t.Errorf("no such program: %v, want ErrNoProgram", err)
		}
	})

	t.Run("Stdin", func(t *testing.T) {
		c := k.start(t, jupyter.CommandRequest{Argv: []string{"wc", "-c"}, Stdin: true})
		in := c.Stdin()
		if in == nil {
			t.Fatal("no input")
		}
		in.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(in, "twelve bytes"); err != nil {
			t.Fatal(err)
		}
		in.Close()
		out, _, code := output(t, c)
		if strings.TrimSpace(out) != "12" || code != 0 {
			t.Errorf("wc -c: %q exit %d", out, code)
		}
		if _, err := io.WriteString(in, "more"); err == nil {
			t.Errorf("a write to the input of an ended command succeeded")
		}
	})

	t.Run("StdinNotRead", func(t *testing.T) {
		// A command that ends without reading its open input ends.
		c := k.start(t, jupyter.CommandRequest{Argv: []string{"/bin/sh", "-c", "exit 4"}, Stdin: true})
		if _, _, code := output(t, c); code != 4 {
			t.Errorf("exit code %d, want 4", code)
		}
		in := c.Stdin()
		in.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(in, "late"); err == nil {
			t.Errorf("a write to the input of an ended command succeeded")
		}
	})

	t.Run("Interrupt", func(t *testing.T) {
		// The shell's trap is set before it says ready, so the SIGINT
		// finds it whenever it comes.
		c := k.start(t, jupyter.CommandRequest{Argv: []string{"/bin/sh", "-c", "trap 'echo got INT; exit 5' INT; echo ready; while :; do sleep 0.1; done"}})
		r := bufio.NewReader(c.Stdout())
		if line := firstLine(t, r); line != "ready" {
			t.Fatalf("first line %q", line)
		}
		if err := c.Interrupt(); err != nil {
			t.Fatal(err)
		}
		rest, _ := io.ReadAll(r)
		if code := c.ExitCode(); code != 5 || string(rest) != "got INT\n" {
			t.Errorf("interrupted: exit code %d, output after %q; want 5 and got INT", code, rest)
		}
		if err := c.Interrupt(); !errors.Is(err, os.ErrProcessDone) {
			t.Errorf("interrupt after the end: %v", err)
		}
		c.Stdout().Close()
		c.Stderr().Close()
	})

	t.Run("InterruptEndsTheGroup", func(t *testing.T) {
		// SIGINT to the group ends a foreground child and its shell: 130.
		c := k.start(t, jupyter.CommandRequest{Argv: []string{"/bin/sh", "-c", "exec sleep 60"}})
		if err := c.Interrupt(); err != nil {
			t.Fatal(err)
		}
		if _, _, code := output(t, c); code != 128+int(syscall.SIGINT) {
			t.Errorf("interrupted sleep: exit code %d, want 130", code)
		}
	})

	t.Run("KillTheGroup", func(t *testing.T) {
		// A child in the background, which ignores SIGINT: Kill ends it too.
		c := k.start(t, jupyter.CommandRequest{Argv: []string{"/bin/sh", "-c", "sleep 60 & echo $!; wait"}})
		r := bufio.NewReader(c.Stdout())
		child, err := strconv.Atoi(firstLine(t, r))
		if err != nil || !alive(child) {
			t.Fatalf("child %d not running (%v)", child, err)
		}
		if err := c.Kill(); err != nil {
			t.Fatal(err)
		}
		io.ReadAll(r)
		if code := c.ExitCode(); code != 128+int(syscall.SIGKILL) {
			t.Errorf("killed: exit code %d, want 137", code)
		}
		if c.KilledWithKernel(0) {
			t.Errorf("a command killed while its kernel runs counts as killed with it")
		}
		waitFor(t, "the command's child "+strconv.Itoa(child)+" to end with it", func() bool { return !alive(child) })
		c.Stdout().Close()
		c.Stderr().Close()
	})

	t.Run("LeakNothing", func(t *testing.T) {
		// Commands leave no goroutine, file or process behind, on either
		// end of the stream (the test node runs in this process).
		output(t, k.start(t, jupyter.CommandRequest{Argv: []string{"true"}, Stdin: true}))
		before := leakcheck.Snapshot(t)
		for range 2 {
			output(t, k.start(t, jupyter.CommandRequest{Argv: []string{"echo", "plain"}}))
			c := k.start(t, jupyter.CommandRequest{Argv: []string{"cat"}, Stdin: true})
			c.Stdin().Close()
			output(t, c)
			output(t, k.start(t, jupyter.CommandRequest{Argv: []string{"true"}, Stdin: true}))
			c = k.start(t, jupyter.CommandRequest{Argv: []string{"/bin/sh", "-c", "sleep 60 & wait"}})
			if err := c.Kill(); err != nil {
				t.Fatal(err)
			}
			output(t, c)
		}
		leakcheck.Check(t, before)
	})

	t.Run("EndsWithThePod", func(t *testing.T) {
		c := k.start(t, jupyter.CommandRequest{Argv: []string{"/bin/sh", "-c", "echo $$; exec sleep 60"}})
		r := bufio.NewReader(c.Stdout())
		pid, err := strconv.Atoi(firstLine(t, r))
		if err != nil {
			t.Fatal(err)
		}
		if err := k.proc.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		select {
		case <-c.Done():
		case <-time.After(time.Minute):
			t.Fatal("the command outlived its pod")
		}
		if code := c.ExitCode(); code != 128+int(syscall.SIGKILL) || !c.KilledWithKernel(30*time.Second) {
			t.Errorf("a command of a deleted pod: exit code %d, killed with its kernel %v; want 137, true", code, c.KilledWithKernel(0))
		}
		waitFor(t, "the command's process "+strconv.Itoa(pid)+" to end with its pod", func() bool { return !alive(pid) })
		io.ReadAll(r)
		c.Stdout().Close()
		c.Stderr().Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := k.proc.StartCommand(ctx, jupyter.CommandRequest{Argv: []string{"true"}}); !errors.Is(err, jupyter.ErrKernelDied) {
			t.Errorf("a command in an ended pod: %v, want ErrKernelDied", err)
		}
	})
}

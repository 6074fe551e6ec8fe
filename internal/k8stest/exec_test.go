//go:build linux

package k8stest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/utils/exec"
)

// execVia is how a client reaches pods/exec.
type execVia string

const (
	viaWebsocket execVia = "websocket" // v5.channel.k8s.io, translated to SPDY by the apiserver
	viaSPDY      execVia = "spdy"
)

// execIn runs argv in the pod's container "main" through the apiserver
// and returns its stdout, stderr and the stream's error (a
// utilexec.ExitError for a nonzero exit code).
func (c *cluster) execIn(t *testing.T, ctx context.Context, via execVia, pod string, argv []string, stdin io.Reader) (string, string, error) {
	t.Helper()
	req := c.cp.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(c.ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "main", Command: argv, Stdin: stdin != nil, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	var ex remotecommand.Executor
	var err error
	switch via {
	case viaWebsocket:
		ex, err = remotecommand.NewWebSocketExecutor(c.cp.Config, http.MethodGet, req.URL().String())
	default:
		ex, err = remotecommand.NewSPDYExecutor(c.cp.Config, http.MethodPost, req.URL())
	}
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: &stdout, Stderr: &stderr})
	if err != nil && httpstream.IsUpgradeFailure(err) {
		t.Fatalf("exec %v via %s: %v", argv, via, err)
	}
	return stdout.String(), stderr.String(), err
}

// stream runs argv in the pod over SPDY, its stdout and stderr to out.
func (c *cluster) stream(ctx context.Context, pod string, argv []string, out io.Writer) error {
	req := c.cp.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(c.ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "main", Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(c.cp.Config, http.MethodPost, req.URL())
	if err != nil {
		return err
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: out, Stderr: out})
}

// firstWrite closes ch at its first write.
type firstWrite struct {
	ch   chan struct{}
	once sync.Once
}

func (w *firstWrite) Write(b []byte) (int, error) {
	w.once.Do(func() { close(w.ch) })
	return len(b), nil
}

func exitCodeOf(err error) int {
	var ee utilexec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitStatus()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestExec runs commands in a pod of the test node through pods/exec, as
// kubectl exec does, over both the websocket and the SPDY protocol.
func TestExec(t *testing.T) {
	c := startCluster(t)
	c.create(t, newPod("shell", "sleep", "60"))
	pod := c.wait(t, "shell", "Running", running)
	env := environ(t, pidOf(t, pod))

	for _, via := range []execVia{viaWebsocket, viaSPDY} {
		t.Run(string(via), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// The container's env and cwd; stdout and stderr apart; the exit code.
			out, errOut, err := c.execIn(t, ctx, via, "shell", []string{"sh", "-c", `echo "ip=$POD_IP"; pwd; echo oops >&2; exit 3`}, nil)
			if code := exitCodeOf(err); code != 3 {
				t.Errorf("exit code %d (%v), want 3", code, err)
			}
			if want := "ip=" + pod.Status.PodIP + "\n" + env["HOME"] + "\n"; out != want {
				t.Errorf("stdout %q, want %q", out, want)
			}
			if errOut != "oops\n" {
				t.Errorf("stderr %q, want %q", errOut, "oops\n")
			}
			// Success is no error.
			if out, _, err := c.execIn(t, ctx, via, "shell", []string{"echo", "fine"}, nil); err != nil || out != "fine\n" {
				t.Errorf("echo: %q %v", out, err)
			}
			// Stdin, to its end.
			if out, _, err := c.execIn(t, ctx, via, "shell", []string{"wc", "-c"}, strings.NewReader("twelve bytes")); err != nil || strings.TrimSpace(out) != "12" {
				t.Errorf("wc -c of stdin: %q %v", out, err)
			}
			// A command ended by a signal: 128+n.
			if _, _, err := c.execIn(t, ctx, via, "shell", []string{"sh", "-c", "kill -TERM $$"}, nil); exitCodeOf(err) != 143 {
				t.Errorf("killed by SIGTERM: %v, want exit code 143", err)
			}
			// No such program: an error, no exit code.
			if _, _, err := c.execIn(t, ctx, via, "shell", []string{"no-such-program"}, nil); err == nil || exitCodeOf(err) > 0 {
				t.Errorf("no such program: %v", err)
			}
		})
	}

	t.Run("EndsWithThePod", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done := make(chan error, 1)
		started := &firstWrite{ch: make(chan struct{})}
		go func() {
			done <- c.stream(ctx, "shell", []string{"sh", "-c", "echo started; exec sleep 60"}, started)
		}()
		select {
		case <-started.ch:
		case err := <-done:
			t.Fatalf("the exec ended before it ran: %v", err)
		}
		if err := c.cp.Client.CoreV1().Pods(c.ns).Delete(ctx, "shell", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			// SIGTERM with the container's process group, SIGKILL if it
			// outlives the container's process.
			if code := exitCodeOf(err); code != 143 && code != 137 {
				t.Errorf("a command of a deleted pod ended with %v, want exit code 143 or 137", err)
			}
		case <-ctx.Done():
			t.Fatal("the exec did not end with its pod")
		}
	})
}

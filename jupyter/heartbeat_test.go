//go:build linux

package jupyter

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/testkernels"
)

// heartbeatConfig pings a kernel with work in flight every 100 ms and
// takes one that leaves a ping unanswered for a second for dead.
func heartbeatConfig(t *testing.T, name string) Config {
	return Config{Spec: testkernels.Spec(t, name), HeartbeatPeriod: 100 * time.Millisecond, HeartbeatTimeout: time.Second}
}

// A kernel stopped while it runs code answers nothing, its heartbeat
// included: the request fails saying the heartbeat stopped, the kernel
// is done and its process killed.
func TestHeartbeatStoppedKernelIsDead(t *testing.T) {
	k := startWith(t, testProvisioner(t), heartbeatConfig(t, "python3"))
	pid := k.PID()
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	c := newCollector()
	call, err := k.StartExecute(NewExecute(pySleeping), c.handle)
	if err != nil {
		t.Fatal(err)
	}
	c.await(t, StreamMsg, 30*time.Second)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = call.Wait(ctx)
	var died *DiedError
	if !errors.As(err, &died) || died.Heartbeat != time.Second || !strings.Contains(died.Reason, "heartbeat") {
		t.Fatalf("the run of a stopped kernel ended with %v, want a DiedError saying its heartbeat stopped", err)
	}
	t.Logf("run: %v", err)
	select {
	case <-k.Done():
	default:
		t.Fatal("the kernel is not done")
	}
	if !errors.As(k.Err(), &died) || died.Heartbeat == 0 {
		t.Errorf("kernel error %v, want the heartbeat's", k.Err())
	}
	select {
	case <-k.proc.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the stopped kernel's process was not killed")
	}
}

// A kernel busy in a long computation, Python holding the GIL or Deno in
// a tight loop, answers every heartbeat and is left alone; once it is
// idle its heartbeat goes quiet: no timer is left armed.
func TestHeartbeatBusyKernelLives(t *testing.T) {
	for _, c := range []struct{ name, code string }{
		{"python3", "sum(range(60_000_000))"},
		{"python3", "import time\nfor _ in range(40): time.sleep(0.05)"},
		{"deno", "{ const t = Date.now(); let x = 0; while (Date.now() - t < 2500) { x++ } }"},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := startWith(t, testProvisioner(t), heartbeatConfig(t, c.name))
			before := k.pings.Load()
			t0 := time.Now()
			reply, col := execute(t, k, c.code)
			took := time.Since(t0)
			if r := replyOf(t, reply); r.Status != "ok" {
				t.Fatalf("%q: reply %+v, output %q", c.code, r, streams(col))
			}
			if err := k.Err(); err != nil {
				t.Fatalf("the busy kernel was taken for dead: %v", err)
			}
			pinged := k.pings.Load() - before
			t.Logf("%q took %v: %d heartbeats answered", c.code, took, pinged)
			if took > 500*time.Millisecond && pinged == 0 {
				t.Errorf("a run of %v was never pinged", took)
			}
			waitFor(t, 10*time.Second, "the idle kernel's heartbeat to go quiet", func() bool {
				k.mu.Lock()
				defer k.mu.Unlock()
				return k.hbTimer == nil && k.work == 0
			})
		})
	}
}

// Deno ignores a control request it does not know, without a reply or a
// status: once its heartbeat showed it alive past the timeout, the
// request is not work any more and the heartbeat goes quiet.
func TestHeartbeatIgnoredRequestGoesQuiet(t *testing.T) {
	k := startWith(t, testProvisioner(t), heartbeatConfig(t, "deno"))
	m, err := k.NewMessage(MsgType("inspect_request"), map[string]any{"code": "x", "cursor_pos": 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := k.Request(Control, m, nil, CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Forget(c)
	waitFor(t, 10*time.Second, "the heartbeat to go quiet", func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.hbTimer == nil && k.work == 0
	})
	select {
	case <-c.Done():
		t.Fatal("Deno answered the inspect_request on control: the test needs a request it ignores")
	default:
	}
	if k.pings.Load() == 0 {
		t.Error("the kernel was not pinged while the request was new")
	}
	if err := k.Err(); err != nil {
		t.Errorf("the kernel was taken for dead: %v", err)
	}
}

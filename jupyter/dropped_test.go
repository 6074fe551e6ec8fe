//go:build linux

package jupyter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// ipykernel never answers an execute_request whose code holds a NUL: it
// goes idle for it and waits for the next request. The request fails
// with ErrRequestDropped within seconds, and the kernel runs on with its
// state.
func TestDroppedRequestFailsKeepingTheKernel(t *testing.T) {
	k := startKernel(t, "python3")
	if reply, _ := execute(t, k, "x = 41"); replyOf(t, reply).Status != "ok" {
		t.Fatalf("x = 41: %+v", replyOf(t, reply))
	}
	col := newCollector()
	c, err := k.StartExecute(NewExecute("y = \"a\x00b\""), col.handle)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("a request the kernel dropped never ended")
	}
	if _, err := c.Result(); !errors.Is(err, ErrRequestDropped) {
		t.Fatalf("dropped request: err %v, want ErrRequestDropped", err)
	}
	reply, out := execute(t, k, "print(x + 1)")
	if replyOf(t, reply).Status != "ok" {
		t.Fatalf("the kernel after the dropped request: %+v", replyOf(t, reply))
	}
	if s := contentOf(t, out.await(t, StreamMsg, time.Second)); s.Text != "42\n" {
		t.Errorf("the kernel lost its state: printed %q, want 42", s.Text)
	}
	if k.Err() != nil {
		t.Errorf("the kernel ended: %v", k.Err())
	}
}

// A request whose idle status never comes (here ipykernel is made to skip
// publishing it once) ends with its reply once a later request shows the
// kernel has moved on, instead of waiting for ever.
func TestLostIdleStatusEndsTheRequest(t *testing.T) {
	endsWithItsReply(t, startKernel(t, "python3"), skipIdleStatuses(1))
}

// A kernel flooding its iopub socket past the high-water mark drops status
// messages with its output: the request's idle status and the idle status
// of the kernel_info_request probing for it. The probing goes on until an
// idle status comes through, and the request ends with its reply. Here
// ipykernel is made to skip three idle statuses: the request's and those
// of the first two probes.
func TestLostProbeIdleStatusProbesAgain(t *testing.T) {
	endsWithItsReply(t, startKernel(t, "python3"), skipIdleStatuses(3))
}

// skipIdleStatuses is code that makes ipykernel skip publishing its next n
// idle statuses (the first is its own request's), and sets x.
func skipIdleStatuses(n int) string {
	return fmt.Sprintf(`k = get_ipython().kernel
publish = k._publish_status
skipped = 0
def skip_idle(status, channel, parent=None):
    global skipped
    if status == "idle" and skipped < %d:
        skipped += 1
        if skipped == %d:
            del k._publish_status
        return
    publish(status, channel, parent)
k._publish_status = skip_idle
x = 41`, n, n)
}

// endsWithItsReply executes code, which loses idle statuses, and checks
// that the request still ends with its reply and the kernel runs on.
func endsWithItsReply(t *testing.T, k *Kernel, code string) {
	t.Helper()
	c, err := k.StartExecute(NewExecute(code), nil)
	if err != nil {
		t.Fatal(err)
	}
	reply, err := c.Wait(deadlineContext(t, 30*time.Second))
	if err != nil {
		t.Fatalf("a request whose idle statuses were lost: %v", err)
	}
	if replyOf(t, reply).Status != "ok" {
		t.Fatalf("reply %+v", replyOf(t, reply))
	}
	if reply, _ := execute(t, k, "x + 1"); replyOf(t, reply).Status != "ok" {
		t.Errorf("the kernel after the lost idle statuses: %+v", replyOf(t, reply))
	}
}

// A reply that comes a moment after the request's idle status (as Deno's
// can) still ends the request: the probe waits for it first. Here
// ipykernel is made to send one execute_reply 300 ms late.
func TestLateReplyAfterIdleStillWins(t *testing.T) {
	k := startKernel(t, "python3")
	lateReply := `import threading
k = get_ipython().kernel
send = k.session.send
def late(stream, msg_or_type, *args, **kwargs):
    if msg_or_type != "execute_reply":
        return send(stream, msg_or_type, *args, **kwargs)
    k.session.send = send
    threading.Timer(0.3, send, (stream, msg_or_type) + args, kwargs).start()
    return {"content": {"status": "ok"}}
k.session.send = late
x = 41`
	var mu sync.Mutex
	var order []MsgType
	c, err := k.StartExecute(NewExecute(lateReply), func(ch Channel, m *Message) {
		if m.Header.MsgType == ExecuteReply || (m.Header.MsgType == StatusMsg && isIdle(m)) {
			mu.Lock()
			order = append(order, m.Header.MsgType)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	reply, err := c.Wait(deadlineContext(t, 30*time.Second))
	if err != nil {
		t.Fatalf("a late reply: %v", err)
	}
	if replyOf(t, reply).Status != "ok" {
		t.Fatalf("reply %+v", replyOf(t, reply))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(order) != 2 || order[0] != StatusMsg {
		t.Errorf("messages %v: want the idle status before the reply", order)
	}
}

func deadlineContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

package sessions

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"kernelgate/jupyter"
)

// lateResult answers an execute_request as Deno sometimes does: its
// execute_result after its reply and its status: idle.
func lateResult(r *fakeRequest) {
	if r.Msg.Type() != jupyter.ExecuteRequest {
		fakeAnswer(r)
		return
	}
	r.Status(jupyter.StateBusy)
	r.Stream("out\n")
	r.Reply(map[string]any{"status": "ok"})
	r.Status(jupyter.StateIdle)
	if r.Code() != "nothing" {
		r.Result("5")
	}
}

// clientRequest sends an execute_request from a client and returns the
// types of the iopub messages answering it, up to and including its idle
// status.
func clientRequest(t *testing.T, k *Kernel, code string) []string {
	t.Helper()
	c, err := k.Attach("s")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req, _ := jupyter.NewMessage("s", jupyter.ExecuteRequest, jupyter.NewExecute(code), nil)
	if err := c.Send(context.Background(), Shell, req); err != nil {
		t.Fatal(err)
	}
	return iopubUntilIdle(t, c, req.Header.MsgID)
}

// iopubUntilIdle returns the types of the iopub messages client c gets
// for request id, up to and including its idle status.
func iopubUntilIdle(t *testing.T, c *Client, id string) []string {
	t.Helper()
	var got []string
	deadline := time.After(10 * time.Second)
	for {
		items, err := c.Take()
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range items {
			if o.Channel != IOPub || o.Msg.ParentID != id {
				continue
			}
			got = append(got, string(o.Msg.Type())+string(o.Msg.ExecutionState()))
			if o.Msg.ExecutionState() == jupyter.StateIdle {
				return got
			}
		}
		if len(items) == 0 {
			select {
			case <-c.Ready():
			case <-deadline:
				t.Fatalf("no idle status; got %v", got)
			}
		}
	}
}

func TestIdleHeldUntilLateResult(t *testing.T) {
	for _, tc := range []struct {
		name, impl, metadata string
		wait                 time.Duration
		code                 string
		want                 string
	}{
		// A Deno-like kernel (by implementation): the result comes before
		// the idle status.
		{"deno-like", "Deno kernel", "", time.Minute, "x", "statusbusy stream execute_result statusidle"},
		// The kernelspec turns it off: the kernel's own order.
		{"spec-off", "Deno kernel", `{"late_output_wait": 0}`, time.Minute, "x", "statusbusy stream statusidle"},
		// The kernelspec turns it on for another kernel.
		{"spec-on", "other", `{"late_output_wait": "1m"}`, 0, "x", "statusbusy stream execute_result statusidle"},
		// Other kernels: not held.
		{"other", "other", "", time.Minute, "x", "statusbusy stream statusidle"},
		// No result at all: the idle status comes after the wait.
		{"no-result", "Deno kernel", "", 20 * time.Millisecond, "nothing", "statusbusy stream statusidle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			specs := fakeSpecs(t)
			if tc.metadata != "" {
				specs = fakeSpecs(t, tc.metadata)
			}
			m := newFakeManagerWith(t, Config{LateOutputWait: tc.wait}, &fakeKernels{script: lateResult, impl: tc.impl}, specs)
			k, err := m.StartKernel(context.Background(), StartOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(clientRequest(t, k, tc.code), " "); got != tc.want {
				t.Errorf("client got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestBadLateOutputWaitRefusesTheKernel(t *testing.T) {
	m := newFakeManagerWith(t, Config{}, &fakeKernels{}, fakeSpecs(t, `{"late_output_wait": "soon"}`))
	if _, err := m.StartKernel(context.Background(), StartOptions{}); !errors.Is(err, ErrKernelStart) || !strings.Contains(err.Error(), "late_output_wait") {
		t.Fatalf("got %v, want ErrKernelStart naming late_output_wait", err)
	}
}

// A request that fails releases its held idle status with its error, not
// after the wait.
func TestIdleHeldUntilLateError(t *testing.T) {
	f := &fakeKernels{impl: "Deno kernel", script: func(r *fakeRequest) {
		r.Status(jupyter.StateBusy)
		r.Reply(map[string]any{"status": "error", "ename": "Error", "evalue": "boom", "traceback": []string{}})
		r.Status(jupyter.StateIdle)
		r.Error("Error", "boom")
	}}
	m := newFakeManager(t, Config{LateOutputWait: time.Minute}, f)
	k, err := m.StartKernel(context.Background(), StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(clientRequest(t, k, "throw"), " "); got != "statusbusy error statusidle" {
		t.Errorf("client got %s", got)
	}
}

// A result that comes later after its idle status than the kernel's wait
// raises the wait, so that the next requests keep theirs.
func TestLateResultRaisesTheWait(t *testing.T) {
	gate := make(chan struct{})
	f := &fakeKernels{impl: "Deno kernel", script: func(r *fakeRequest) {
		if r.Msg.Type() != jupyter.ExecuteRequest {
			fakeAnswer(r)
			return
		}
		r.Status(jupyter.StateBusy)
		r.Reply(map[string]any{"status": "ok"})
		r.Status(jupyter.StateIdle)
		<-gate
		r.Result("5")
	}}
	const wait = 5 * time.Millisecond
	m := newFakeManager(t, Config{LateOutputWait: wait}, f)
	raised := make(chan slog.Record, 1)
	m.log = slog.New(recordHandler(raised))
	k, err := m.StartKernel(context.Background(), StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The idle status comes after the wait, without the result: the
	// result then comes later still.
	if got := strings.Join(clientRequest(t, k, "x"), " "); got != "statusbusy statusidle" {
		t.Fatalf("client got %s", got)
	}
	close(gate)
	select {
	case <-raised:
	case <-time.After(10 * time.Second):
		t.Fatal("the late result did not raise the wait")
	}
	k.mu.Lock()
	got := k.lateWait
	k.mu.Unlock()
	if got < 2*wait || got > maxLateWait {
		t.Errorf("wait raised to %v, want from %v to %v", got, 2*wait, maxLateWait)
	}
}

// recordHandler sends the log records about late output to ch.
type recordHandler chan<- slog.Record

func (h recordHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "late") {
		return nil
	}
	select {
	case h <- r:
	default:
	}
	return nil
}
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordHandler) WithGroup(string) slog.Handler      { return h }

// A request that repeats the msg_id of one in flight is refused, and the
// first request keeps its held idle status: its late result still comes
// before it.
func TestRepeatedMsgIDKeepsTheFirstHold(t *testing.T) {
	gate := make(chan struct{})
	f := &fakeKernels{impl: "Deno kernel", script: func(r *fakeRequest) {
		if r.Msg.Type() != jupyter.ExecuteRequest {
			fakeAnswer(r)
			return
		}
		r.Status(jupyter.StateBusy)
		r.Reply(map[string]any{"status": "ok"})
		<-gate
		r.Status(jupyter.StateIdle)
		r.Result("5")
	}}
	m := newFakeManager(t, Config{LateOutputWait: time.Minute}, f)
	k, err := m.StartKernel(context.Background(), StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := k.Attach("s")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req, _ := jupyter.NewMessage("s", jupyter.ExecuteRequest, jupyter.NewExecute("x"), nil)
	if err := c.Send(context.Background(), Shell, req); err != nil {
		t.Fatal(err)
	}
	again := *req
	if err := c.Send(context.Background(), Shell, &again); !errors.Is(err, ErrConflict) {
		t.Fatalf("a repeated msg_id in flight: %v, want ErrConflict", err)
	}
	close(gate)
	if got := strings.Join(iopubUntilIdle(t, c, req.Header.MsgID), " "); got != "statusbusy execute_result statusidle" {
		t.Errorf("the first request got %s, want its result before its idle status", got)
	}
}

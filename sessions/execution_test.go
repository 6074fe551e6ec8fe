package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"kernelgate/jupyter"
	"kernelgate/runs"
)

// errorEvents returns the run's error events.
func errorEvents(t *testing.T, r *runs.Run) []runs.ExecError {
	t.Helper()
	evs, _, _ := r.Events(0)
	var out []runs.ExecError
	for _, ev := range evs {
		if ev.Type != "error" {
			continue
		}
		var e runs.ExecError
		if err := json.Unmarshal(ev.JSON, &e); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// A run carries one error, in its events and in its runs.Execution, whichever
// of the execute_reply and the error message comes first (Deno sends its
// reply first now and then).
func TestOneErrorPerRun(t *testing.T) {
	for _, replyFirst := range []bool{true, false} {
		f := &fakeKernels{script: func(r *fakeRequest) {
			if r.Msg.Type() != jupyter.ExecuteRequest {
				fakeAnswer(r)
				return
			}
			r.Status(jupyter.StateBusy)
			reply := func() {
				r.Reply(map[string]any{"status": "error", "ename": "Error", "evalue": "boom", "traceback": []string{}})
			}
			if replyFirst {
				reply()
			}
			r.Error("Error", "boom")
			if !replyFirst {
				reply()
			}
			r.Status(jupyter.StateIdle)
		}}
		m := newFakeManager(t, Config{}, f)
		r, e := run(t, m, ExecuteRequest{Code: "throw"})
		errs := errorEvents(t, r)
		if len(errs) != 1 {
			t.Errorf("reply first %v: %d error events, want 1: %+v", replyFirst, len(errs), errs)
		}
		if e.Error == nil || len(e.Error.Traceback) == 0 {
			t.Errorf("reply first %v: runs.Execution error %+v, want the error message's (with its traceback)", replyFirst, e.Error)
		}
	}
}

// An error only the reply reports still ends up in the run, once.
func TestReplyOnlyErrorIsKept(t *testing.T) {
	f := &fakeKernels{script: func(r *fakeRequest) {
		if r.Msg.Type() != jupyter.ExecuteRequest {
			fakeAnswer(r)
			return
		}
		r.Status(jupyter.StateBusy)
		r.Reply(map[string]any{"status": "error", "ename": "Interrupted", "evalue": "stopped", "traceback": []string{}})
		r.Status(jupyter.StateIdle)
	}}
	m := newFakeManager(t, Config{}, f)
	r, e := run(t, m, ExecuteRequest{Code: "x"})
	if errs := errorEvents(t, r); len(errs) != 1 || errs[0].Name != "Interrupted" {
		t.Errorf("error events %+v, want the reply's", errs)
	}
	if e.Error == nil || e.Error.Name != "Interrupted" || e.Process.Reason != runs.Errored {
		t.Errorf("Execution %+v %+v", e.Error, e.Process)
	}
}

// An input_request that comes before the gateway has gone on from sending
// the code is answered: the run takes input from the moment it is sent.
func TestInputRequestBeforeTheSendReturns(t *testing.T) {
	asked := make(chan struct{})
	f := &fakeKernels{script: func(r *fakeRequest) {
		if r.Msg.Type() != jupyter.ExecuteRequest {
			fakeAnswer(r)
			return
		}
		r.Status(jupyter.StateBusy)
		req, _ := jupyter.NewMessage("fake-kernel", jupyter.InputRequest, map[string]any{"prompt": "value? ", "password": false}, r.Msg)
		r.k.deliver(Stdin, req)
		close(asked)
		var answer struct{ Value string }
		select {
		case reply := <-r.k.stdin:
			reply.DecodeContent(&answer)
		case <-r.k.done:
			return
		}
		r.Stream("got " + answer.Value + "\n")
		r.Reply(map[string]any{"status": "ok"})
		r.Status(jupyter.StateIdle)
	}}
	runs := make(chan *runs.Run, 1)
	answered := make(chan error, 1)
	f.sent = func(m *Message) {
		if m.Type() != jupyter.ExecuteRequest || (&fakeRequest{Msg: m}).silent() {
			return
		}
		select {
		case <-asked:
		case <-time.After(10 * time.Second):
			answered <- errors.New("no input_request")
			return
		}
		r := <-runs
		answered <- r.Input("42")
	}
	m := newFakeManager(t, Config{}, f)
	r, err := m.Execute(context.Background(), ExecuteRequest{Code: "print('got', input('value? '))", Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	runs <- r
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("the answer to an input_request that came at once: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the run's code was never sent")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if e := execution(t, r); strings.Join(e.Logs.Stdout, "") != "got 42\n" {
		t.Fatalf("stdout %q, want the answer", e.Logs.Stdout)
	}
}

// An interrupt that comes while the run's code is being sent stops the
// run: it is not lost between the queue and the running run.
func TestInterruptWhileTheCodeIsSent(t *testing.T) {
	sent := make(chan *runs.Run, 1)
	f := &fakeKernels{}
	f.sent = func(m *Message) {
		if m.Type() != jupyter.ExecuteRequest || (&fakeRequest{Msg: m}).silent() {
			return
		}
		(<-sent).Interrupt()
	}
	m := newFakeManager(t, Config{}, f)
	r, err := m.Execute(context.Background(), ExecuteRequest{Code: "sleep"})
	if err != nil {
		t.Fatal(err)
	}
	sent <- r
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Wait(ctx); err != nil {
		t.Fatalf("the run was not stopped by its interrupt: %v", err)
	}
	e := execution(t, r)
	if e.Error == nil || e.Error.Name != "KeyboardInterrupt" || e.Process.Reason != runs.Interrupted {
		t.Fatalf("error %+v, process %+v: want a KeyboardInterrupt and the reason %q", e.Error, e.Process, runs.Interrupted)
	}
}

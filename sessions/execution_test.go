package sessions

import (
	"encoding/json"
	"testing"

	"kernelgate/jupyter"
)

// errorEvents returns the run's error events.
func errorEvents(t *testing.T, r *Run) []ExecError {
	t.Helper()
	evs, _, _ := r.Events(0)
	var out []ExecError
	for _, ev := range evs {
		if ev.Type != "error" {
			continue
		}
		var e ExecError
		if err := json.Unmarshal(ev.JSON, &e); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// A run carries one error, in its events and in its Execution, whichever
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
			t.Errorf("reply first %v: Execution error %+v, want the error message's (with its traceback)", replyFirst, e.Error)
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
	if e.Error == nil || e.Error.Name != "Interrupted" || e.Process.Reason != Errored {
		t.Errorf("Execution %+v %+v", e.Error, e.Process)
	}
}

//go:build linux

package sessions

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"kernelgate/jupyter"
	"kernelgate/runs"
)

// heartbeatCfg takes a kernel with work in flight that leaves a heartbeat
// unanswered for a second for dead.
var heartbeatCfg = Config{HeartbeatPeriod: 100 * time.Millisecond, HeartbeatTimeout: time.Second}

// stop SIGSTOPs pid, and SIGCONTs it when the test ends.
func stop(t *testing.T, pid int) {
	t.Helper()
	if pid == 0 {
		t.Fatal("no kernel process")
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
}

// A context's kernel stopped during a run (it answers nothing, its
// heartbeat included) loses the run, which says the heartbeat stopped
// and that the state is gone; the next run starts a new kernel.
func TestHeartbeatStoppedContextKernelLosesTheRun(t *testing.T) {
	m := newRealManager(t, heartbeatCfg)
	ctx := context.Background()
	c, err := m.CreateContext(ctx, ContextRequest{ID: "hb", Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	if _, e := run(t, m, ExecuteRequest{Context: c.ID, Code: "x = 5"}); e.Process.Reason != runs.Completed {
		t.Fatalf("x = 5 ended %+v", e.Process)
	}
	r, err := m.Execute(ctx, ExecuteRequest{Context: c.ID, Code: "import time\nprint('started', flush=True)\nwhile True: time.sleep(0.05)"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the run to print", func() bool {
		evs, _, _ := r.Events(0)
		for _, ev := range evs {
			if ev.Type == "stdout" {
				return true
			}
		}
		return false
	})
	k, err := m.Kernel(c.KernelID())
	if err != nil {
		t.Fatal(err)
	}
	stop(t, k.PID())
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.Wait(wctx); err != nil {
		t.Fatalf("the run on the stopped kernel did not end: %v", err)
	}
	e := execution(t, r)
	if e.Process.Reason != runs.Lost || !strings.Contains(e.Process.Message, "heartbeat stopped") || !strings.Contains(e.Process.Message, "without the earlier state") {
		t.Fatalf("the run on the stopped kernel ended %+v, want lost saying the heartbeat stopped", e.Process)
	}
	t.Logf("lost: %s", e.Process.Message)
	_, e = run(t, m, ExecuteRequest{Context: c.ID, Code: "x"})
	if e.Error == nil || e.Error.Name != "NameError" {
		t.Errorf("the next run: %+v, error %+v; want a NameError from a new kernel", e.Process.Reason, e.Error)
	}
}

// A Jupyter kernel stopped while a client's request awaits its reply is
// restarted as a kernel that died: clients see restarting, then a new
// process that runs code.
func TestHeartbeatStoppedJupyterKernelRestarts(t *testing.T) {
	m := newRealManager(t, heartbeatCfg)
	ctx := context.Background()
	k, err := m.StartKernel(ctx, StartOptions{Name: "python3"})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := k.Attach("s")
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	old := k.PID()
	req, _ := jupyter.NewMessage("s", jupyter.ExecuteRequest, jupyter.NewExecute("import time\nprint('started', flush=True)\nwhile True: time.sleep(0.05)"), nil)
	if err := cl.Send(ctx, Shell, req); err != nil {
		t.Fatal(err)
	}
	var states []string
	printed, restarted := false, false
	deadline := time.After(60 * time.Second)
	for !restarted {
		items, err := cl.Take()
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range items {
			if o.Msg.Type() == jupyter.StreamMsg && o.Msg.ParentID == req.Header.MsgID && !printed {
				printed = true
				stop(t, old)
			}
			if s := o.Msg.ExecutionState(); s != "" && o.Msg.ParentID == "" {
				states = append(states, string(s))
				restarted = restarted || s == jupyter.StateRestarting
			}
		}
		if len(items) == 0 {
			select {
			case <-cl.Ready():
			case <-deadline:
				t.Fatalf("the stopped kernel was not restarted; states %v", states)
			}
		}
	}
	waitFor(t, "the kernel to be back", func() bool { return k.Running() && k.PID() != old && k.Model().ExecutionState == "idle" })
	c := clientRequest(t, k, "1+1")
	if len(c) == 0 || c[len(c)-1] != "statusidle" {
		t.Errorf("a request to the restarted kernel: %v", c)
	}
}

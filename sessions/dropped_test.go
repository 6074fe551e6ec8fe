package sessions

import (
	"context"
	"kernelgate/runs"
	"strings"
	"testing"
	"time"
)

// A run whose request the kernel drops (ipykernel never answers code that
// holds a NUL; the API refuses such code, so the run is queued here
// directly) ends with an error within seconds; the kernel keeps its state
// and the run queued behind it runs.
func TestDroppedRunEndsAndTheQueueMovesOn(t *testing.T) {
	m := newRealManager(t, Config{})
	if _, e := run(t, m, ExecuteRequest{Code: "x = 41"}); e.Process.Reason != runs.Completed {
		t.Fatalf("x = 41: %+v", e.Process)
	}
	c := mustContext(t, m, "code-python")
	pid := *c.Model().KernelProcessID
	dropped := c.newRun("", ExecuteRequest{Code: "y = \"a\x00b\""})
	if err := c.runs.Enqueue(dropped); err != nil {
		t.Fatal(err)
	}
	next, err := m.Execute(context.Background(), ExecuteRequest{Code: "print(x + 1)"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := dropped.Wait(ctx); err != nil {
		t.Fatalf("the dropped run never ended: %v", err)
	}
	e := execution(t, dropped)
	if e.Process.Reason != runs.Errored || e.Error == nil || e.Error.Name != runs.RequestDropped {
		t.Errorf("dropped run: process %+v, error %+v; want reason error, error %s", e.Process, e.Error, runs.RequestDropped)
	}
	if err := next.Wait(ctx); err != nil {
		t.Fatalf("the run queued behind the dropped one never ended: %v", err)
	}
	e = execution(t, next)
	if e.Process.Reason != runs.Completed || strings.Join(e.Logs.Stdout, "") != "42\n" {
		t.Errorf("run after the dropped one: %+v, stdout %q; want completed, 42", e.Process, e.Logs.Stdout)
	}
	if now := *c.Model().KernelProcessID; now != pid {
		t.Errorf("the kernel was replaced: pid %d, then %d", pid, now)
	}
}

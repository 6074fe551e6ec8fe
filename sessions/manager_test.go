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

// run executes code and waits for its end.
func run(t *testing.T, m *Manager, req ExecuteRequest) (*runs.Run, runs.Execution) {
	t.Helper()
	req.Wait = true
	r, err := m.Execute(context.Background(), req)
	if err != nil {
		t.Fatalf("execute %q: %v", req.Code, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Wait(ctx); err != nil {
		t.Fatalf("run %q did not end: %v", req.Code, err)
	}
	return r, execution(t, r)
}

// execution decodes the run's runs.Execution as the API gives it.
func execution(t *testing.T, r *runs.Run) runs.Execution {
	t.Helper()
	var e runs.Execution
	if err := json.Unmarshal(r.ExecutionJSON(), &e); err != nil {
		t.Fatal(err)
	}
	return e
}

func TestRunsShareStateInOrder(t *testing.T) {
	m := newFakeManager(t, Config{}, &fakeKernels{})
	_, e := run(t, m, ExecuteRequest{Code: "x = 5"})
	if e.Process.Reason != runs.Completed {
		t.Fatalf("x = 5: %+v", e.Process)
	}
	_, e = run(t, m, ExecuteRequest{Code: "x"})
	if e.Process.Reason != runs.Completed || len(e.Results) != 1 || e.Results[0].Text != "5" {
		t.Fatalf("x gave %+v %+v", e.Process, e.Results)
	}
	_, e = run(t, m, ExecuteRequest{Code: "raise"})
	if e.Process.Reason != runs.Errored || e.Error == nil || e.Error.Name != "ValueError" {
		t.Fatalf("raise gave %+v %+v", e.Process, e.Error)
	}
}

func TestQueueFullRefusesAndKeepsOrder(t *testing.T) {
	m := newFakeManager(t, Config{QueueLimit: 2}, &fakeKernels{})
	c, err := m.CreateContext(context.Background(), ContextRequest{ID: "q"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := m.Execute(context.Background(), ExecuteRequest{Code: "sleep", Context: c.ID})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first run to start", func() bool { return first.State() == runs.RunRunning })
	var queued []*runs.Run
	for i := 0; i < 2; i++ {
		r, err := m.Execute(context.Background(), ExecuteRequest{Code: "print " + string(rune('a'+i)), Context: c.ID})
		if err != nil {
			t.Fatal(err)
		}
		queued = append(queued, r)
	}
	if _, err := m.Execute(context.Background(), ExecuteRequest{Code: "print c", Context: c.ID}); !errors.Is(err, runs.ErrQueueFull) {
		t.Fatalf("third queued run: %v, want ErrQueueFull", err)
	}
	if err := interruptContext(m, context.Background(), c.ID); err != nil {
		t.Fatal(err)
	}
	for i, r := range queued {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := r.Wait(ctx)
		cancel()
		if err != nil {
			t.Fatalf("queued run %d: %v", i, err)
		}
		var e runs.Execution
		json.Unmarshal(r.ExecutionJSON(), &e)
		if want := string(rune('a'+i)) + "\n"; strings.Join(e.Logs.Stdout, "") != want {
			t.Errorf("queued run %d printed %q, want %q", i, e.Logs.Stdout, want)
		}
	}
	var e runs.Execution
	json.Unmarshal(first.ExecutionJSON(), &e)
	if e.Process.Reason != runs.Interrupted {
		t.Errorf("interrupted run ended %q", e.Process.Reason)
	}
}

var _ = jupyter.StateIdle

package sessions

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kernelgate/internal/testkernels"
	"kernelgate/kernelspecs"
	"kernelgate/provision/local"
	"kernelgate/runs"
)

// newRealManager returns a manager of real kernels (python3 and deno from
// .kernels), closed when the test ends.
func newRealManager(t *testing.T, cfg Config) *Manager {
	t.Helper()
	testkernels.Spec(t, "python3")
	testkernels.Spec(t, "deno")
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	m := New(cfg, kernelspecs.Load([]string{testkernels.Dir(t)}), &local.Provisioner{RuntimeDir: dir}, nil)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		m.Close(ctx)
	})
	return m
}

// Deno sometimes replies to a throw before it publishes the error: the
// run still carries one error, in its events and its runs.Execution.
func TestDenoThrowsCarryOneError(t *testing.T) {
	m := newRealManager(t, Config{})
	for i := 0; i < 60; i++ {
		r, e := run(t, m, ExecuteRequest{Code: "throw new Error('boom')", Language: "javascript"})
		if errs := errorEvents(t, r); len(errs) != 1 {
			t.Fatalf("throw %d: %d error events, want 1: %+v", i, len(errs), errs)
		}
		if e.Error == nil || e.Error.Value == "" || e.Process.Reason != runs.Errored {
			t.Fatalf("throw %d: runs.Execution error %+v, process %+v", i, e.Error, e.Process)
		}
	}
}

// `exit()` ends a run completed and then the kernel: the next run on the
// context says the earlier state is gone.
func TestPythonExitThenNextRunSaysStateIsGone(t *testing.T) {
	m := newRealManager(t, Config{})
	c, err := m.CreateContext(context.Background(), ContextRequest{ID: "exits", Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	if _, e := run(t, m, ExecuteRequest{Code: "x = 5\nexit()", Context: c.ID}); e.Process.Reason != runs.Completed {
		t.Fatalf("x = 5; exit() ended %+v", e.Process)
	}
	waitFor(t, "the kernel to end", func() bool { return !c.Model().Active })
	_, e := run(t, m, ExecuteRequest{Code: "x", Context: c.ID})
	if e.Error == nil || e.Error.Name != "NameError" {
		t.Fatalf("x after exit(): error %+v", e.Error)
	}
	if !strings.Contains(e.Process.Message, "without the earlier state") {
		t.Errorf("the run after exit() says %q, want that the earlier state is gone", e.Process.Message)
	}
}

// A gateway that stops while a context runs ends the run and the one
// queued behind it saying so, not that the context was deleted.
func TestCloseTellsRunsTheGatewayStopped(t *testing.T) {
	m := newRealManager(t, Config{})
	ctx := context.Background()
	c, err := m.CreateContext(ctx, ContextRequest{ID: "busy", Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	running, err := m.Execute(ctx, ExecuteRequest{Context: c.ID, Code: "import time\nprint('started', flush=True)\ntime.sleep(60)"})
	if err != nil {
		t.Fatal(err)
	}
	queued, err := m.Execute(ctx, ExecuteRequest{Context: c.ID, Code: "1 + 1"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the run to print", func() bool {
		evs, _, _ := running.Events(0)
		for _, ev := range evs {
			if ev.Type == "stdout" {
				return true
			}
		}
		return false
	})
	closed, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	m.Close(closed)
	for r, want := range map[*runs.Run]string{running: "the gateway stopped during the run", queued: "the gateway stopped before the run started"} {
		e := execution(t, r)
		if e.Process.Reason != runs.Lost || !strings.Contains(e.Process.Message, want) {
			t.Errorf("run %q ended %+v, want lost saying %q", r.ID, e.Process, want)
		}
	}
}

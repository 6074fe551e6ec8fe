package sessions

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// recorded returns how many runs the manager keeps records of.
func recorded(m *Manager) (runs, order int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.runs), len(m.runOrder)
}

// A run that never ends, at the head of the records, does not keep the
// finished runs after it from being pruned, and is itself kept.
func TestPruningPassesOverAnUnfinishedRun(t *testing.T) {
	m := newFakeManager(t, Config{RunsKept: 3}, &fakeKernels{})
	if _, err := m.CreateContext(context.Background(), ContextRequest{ID: "long"}); err != nil {
		t.Fatal(err)
	}
	long, err := m.Execute(context.Background(), ExecuteRequest{Code: "sleep", Context: "long"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		run(t, m, ExecuteRequest{Code: "print x"})
	}
	if runs, order := recorded(m); runs > 4 || order != runs {
		t.Errorf("%d runs recorded (%d in order), want at most 3 finished and the running one", runs, order)
	}
	if _, err := m.Run(long.ID); err != nil {
		t.Errorf("the unfinished run's record was dropped: %v", err)
	}
}

// A run refused with QUEUE_FULL leaves no record behind, ends, and does not
// stop the pruning of later runs.
func TestRefusedRunLeavesNoRecord(t *testing.T) {
	m := newFakeManager(t, Config{RunsKept: 2, QueueLimit: 1}, &fakeKernels{})
	if _, err := m.CreateContext(context.Background(), ContextRequest{ID: "q"}); err != nil {
		t.Fatal(err)
	}
	first, err := m.Execute(context.Background(), ExecuteRequest{Code: "sleep", Context: "q"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first run to start", func() bool { return first.State() == RunRunning })
	queued, err := m.Execute(context.Background(), ExecuteRequest{Code: "print queued", Context: "q"})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := recorded(m)
	if _, err := m.Execute(context.Background(), ExecuteRequest{Code: "print refused", Context: "q"}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("got %v, want ErrQueueFull", err)
	}
	if after, order := recorded(m); after != before || order != before {
		t.Errorf("a refused run was recorded: %d runs (%d in order) after, %d before", after, order, before)
	}
	m.InterruptContext(context.Background(), "q")
	within(t, "the queued run to end", 10*time.Second, func() { <-queued.Done() })
	for i := 0; i < 6; i++ {
		run(t, m, ExecuteRequest{Code: "print x", Context: "q"})
	}
	if runs, order := recorded(m); runs > 2 || order > 2 {
		t.Errorf("%d runs recorded (%d in order), want at most 2", runs, order)
	}
}

// Finished runs are bounded by their memory too, oldest first.
func TestRunRecordsAreBoundedByBytes(t *testing.T) {
	m := newFakeManager(t, Config{RunBytes: 64 << 10}, &fakeKernels{})
	var last *Run
	for i := 0; i < 20; i++ {
		last, _ = run(t, m, ExecuteRequest{Code: "print " + strings.Repeat("y", 10<<10)})
	}
	m.mu.Lock()
	runs, bytes := len(m.runs), m.runBytes
	m.mu.Unlock()
	if runs >= 20 || runs == 0 || bytes > 64<<10 {
		t.Errorf("%d runs kept holding %d bytes, want fewer than 20 within 64 KiB", runs, bytes)
	}
	if _, err := m.Run(last.ID); err != nil {
		t.Errorf("the newest run was pruned: %v", err)
	}
}

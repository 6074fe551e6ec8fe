package sessions

import (
	"context"
	"kernelgate/runs"
	"strings"
	"testing"
)

const stateGone = "without the earlier state"

// After the kernel of a context ended between two runs (the code exited
// it, a restart), the next run says the earlier state is gone; runs on the
// same process say nothing, and a lost run's message is not repeated.
func TestRunAfterKernelReplacedSaysStateIsGone(t *testing.T) {
	f := &fakeKernels{}
	m := newFakeManager(t, Config{}, f)
	c, err := m.CreateContext(context.Background(), ContextRequest{ID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	_, e := run(t, m, ExecuteRequest{Code: "x = 5", Context: "s"})
	_, e = run(t, m, ExecuteRequest{Code: "x", Context: "s"})
	if e.Process.Message != "" {
		t.Errorf("a run on the same process says %q", e.Process.Message)
	}
	_, e = run(t, m, ExecuteRequest{Code: "exit", Context: "s"})
	if e.Process.Reason != runs.Completed {
		t.Fatalf("exit ended %+v", e.Process)
	}
	waitFor(t, "the kernel to die", func() bool { return !c.Model().Active })
	_, e = run(t, m, ExecuteRequest{Code: "x", Context: "s"})
	if e.Error == nil || e.Error.Name != "NameError" {
		t.Fatalf("x after exit: %+v", e.Error)
	}
	if !strings.Contains(e.Process.Message, stateGone) || !strings.Contains(e.Process.Message, "died") {
		t.Errorf("the run after exit says %q, want that the kernel died and the state is gone", e.Process.Message)
	}
	_, e = run(t, m, ExecuteRequest{Code: "x = 1", Context: "s"})
	if e.Process.Message != "" {
		t.Errorf("the second run on the new process says %q", e.Process.Message)
	}
	if _, err := restartContext(m, context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	_, e = run(t, m, ExecuteRequest{Code: "print hi", Context: "s"})
	if !strings.Contains(e.Process.Message, "restarted") || !strings.Contains(e.Process.Message, stateGone) {
		t.Errorf("the run after a restart says %q", e.Process.Message)
	}

	// A run lost with its kernel already said so: the next one does not.
	r, err := m.Execute(context.Background(), ExecuteRequest{Code: "sleep", Context: "s"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the run to start", func() bool { return r.State() == runs.RunRunning })
	ks := f.kernels()
	ks[len(ks)-1].crash()
	waitFor(t, "the run to be lost", func() bool { return r.State() == runs.RunDone })
	if e := execution(t, r); e.Process.Reason != runs.Lost || !strings.Contains(e.Process.Message, stateGone) {
		t.Fatalf("the crashed run: %+v", e.Process)
	}
	_, e = run(t, m, ExecuteRequest{Code: "print again", Context: "s"})
	if e.Process.Message != "" {
		t.Errorf("the run after a lost run repeats %q", e.Process.Message)
	}
}

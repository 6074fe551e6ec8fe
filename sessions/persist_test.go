package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kernelgate/internal/leakcheck"
	"kernelgate/jupyter"
	"kernelgate/runs"
	"kernelgate/state"
)

// openStore opens a file store in a directory of the test.
func openStore(t testing.TB, dir string) *state.Bolt {
	t.Helper()
	s, err := state.Open(filepath.Join(dir, state.FileName), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func load(t *testing.T, s state.Store) *state.Snapshot {
	t.Helper()
	snap, err := s.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// Kernels, contexts and sessions are in the store when the call that made
// them returns, and gone from it when they are deleted.
func TestRecordsAreKeptWhenCallsReturn(t *testing.T) {
	store := openStore(t, t.TempDir())
	defer store.Close()
	m := newFakeManager(t, Config{Store: store, PoolSize: 0}, &fakeKernels{})
	ctx := context.Background()
	c, err := m.CreateContext(ctx, ContextRequest{ID: "agent", Env: map[string]string{"A": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	path, typ := "work.ipynb", "notebook"
	sm, err := m.JupyterSessions().Create(ctx, SessionRequest{Path: &path, Type: &typ})
	if err != nil {
		t.Fatal(err)
	}
	snap := load(t, store)
	if len(snap.Contexts) != 1 || snap.Contexts[0].ID != "agent" || snap.Contexts[0].KernelID != c.KernelID() || snap.Contexts[0].Env["A"] != "1" {
		t.Fatalf("contexts kept: %+v", snap.Contexts)
	}
	if len(snap.Sessions) != 1 || snap.Sessions[0].ID != sm.ID || snap.Sessions[0].KernelID != sm.Kernel.ID {
		t.Fatalf("sessions kept: %+v", snap.Sessions)
	}
	ids := map[string]bool{}
	for _, k := range snap.Kernels {
		ids[k.ID] = true
	}
	if len(snap.Kernels) != 2 || !ids[c.KernelID()] || !ids[sm.Kernel.ID] {
		t.Fatalf("kernels kept: %+v", snap.Kernels)
	}

	if err := m.JupyterSessions().Delete(ctx, sm.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteContext(ctx, "agent"); err != nil {
		t.Fatal(err)
	}
	snap = load(t, store)
	if len(snap.Contexts)+len(snap.Sessions)+len(snap.Kernels) != 0 {
		t.Fatalf("records left after the deletes: %+v", snap)
	}
}

// A run's record and its events reach the store (queued, not waited for)
// and are deleted with the run.
func TestRunRecordsAreKept(t *testing.T) {
	store := openStore(t, t.TempDir())
	defer store.Close()
	m := newFakeManager(t, Config{Store: store, PoolSize: 0, RunsKept: 1}, &fakeKernels{})
	r, e := run(t, m, ExecuteRequest{Code: "print hello"})
	if e.Process.Reason != runs.Completed {
		t.Fatalf("run: %+v", e)
	}
	if err := store.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	snap := load(t, store)
	if len(snap.Runs) != 1 || snap.Runs[0].ID != r.ID {
		t.Fatalf("runs kept: %+v", snap.Runs)
	}
	var rec runs.Record
	json.Unmarshal(snap.Runs[0].Data, &rec)
	var kept runs.Execution
	json.Unmarshal(rec.Execution, &kept)
	evs := snap.Runs[0].Events
	if rec.State != runs.RunDone || rec.Context != "code-python" || len(kept.Logs.Stdout) != 1 || kept.Logs.Stdout[0] != e.Logs.Stdout[0] {
		t.Fatalf("run record: %+v %+v", rec, kept)
	}
	if len(evs) != r.LastSeq() || !strings.Contains(string(evs[len(evs)-1].Data), `"type":"end"`) {
		t.Fatalf("run events kept: %d, want %d ending with end", len(evs), r.LastSeq())
	}
	// RunsKept 1: the next run prunes this one, from the store too.
	run(t, m, ExecuteRequest{Code: "print again"})
	run(t, m, ExecuteRequest{Code: "print more"})
	store.Flush(context.Background())
	for _, kr := range load(t, store).Runs {
		if kr.ID == r.ID {
			t.Fatalf("a pruned run is still in the store")
		}
	}
}

// A gateway started on the store of one whose kernels are gone restores
// its contexts, sessions and runs: the context's next run says its state
// was lost, the Jupyter kernel of a session starts again under its id.
func TestRestoreWithKernelsGone(t *testing.T) {
	dir := t.TempDir()
	store := openStore(t, dir)
	f := &fakeKernels{}
	specs := fakeSpecs(t)
	m1 := New(Config{DefaultKernel: "fake", Languages: map[string]string{"python": "fake"}, Store: store}, specs, nil, nil)
	m1.start = f.start
	ctx := context.Background()
	if _, err := m1.CreateContext(ctx, ContextRequest{ID: "agent"}); err != nil {
		t.Fatal(err)
	}
	path, typ := "work.ipynb", "notebook"
	sm, err := m1.JupyterSessions().Create(ctx, SessionRequest{Path: &path, Type: &typ})
	if err != nil {
		t.Fatal(err)
	}
	r1, _ := run(t, m1, ExecuteRequest{Context: "agent", Code: "x = 1"})
	c1, _ := m1.Context("agent")
	kernelID := c1.KernelID()
	// The gateway dies: its kernels with it (a fake process cannot be
	// adopted), its records stay.
	m1.Detach(ctx)
	store.Close()

	store = openStore(t, dir)
	defer store.Close()
	m2 := newFakeManagerWith(t, Config{Store: store, PoolSize: 0}, f, specs)
	m2.reconnect = func(context.Context, jupyter.ProvisionerInfo, jupyter.Config) (connecting, error) {
		return nil, jupyter.ErrNotAdoptable
	}
	rep, err := m2.Restore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Adopted != 0 || rep.Lost != 2 || rep.Contexts != 1 || rep.Sessions != 1 || rep.Runs != 1 {
		t.Fatalf("restore: %+v", rep)
	}
	c2, err := m2.Context("agent")
	if err != nil || c2.KernelID() != kernelID {
		t.Fatalf("context after the restore: %v, kernel %s want %s", err, c2.KernelID(), kernelID)
	}
	kept, err := m2.Run(r1.ID)
	if err != nil || kept.State() != runs.RunDone || !strings.Contains(string(kept.ExecutionJSON()), `"completed"`) {
		t.Fatalf("run after the restore: %v", err)
	}
	if ids := c2.Model().ProcessIDs; len(ids) != 1 || ids[0] != r1.ID {
		t.Fatalf("context's runs after the restore: %v", ids)
	}
	_, e := run(t, m2, ExecuteRequest{Context: "agent", Code: "print x"})
	if !strings.Contains(e.Process.Message, endedWhileDown) || !strings.Contains(e.Process.Message, "without the earlier state") {
		t.Fatalf("the first run after the restore: %+v", e.Process)
	}
	waitFor(t, "the session's kernel to start again", func() bool {
		got, err := m2.JupyterSessions().Get(sm.ID)
		return err == nil && got.Kernel.ID == sm.Kernel.ID && got.Kernel.ExecutionState == "idle"
	})
}

// Managers with a store, closed or detached, leave no goroutine behind.
func TestStoreCycleLeaksNothing(t *testing.T) {
	before := leakcheck.Snapshot(t)
	dir := t.TempDir()
	for i := 0; i < 3; i++ {
		store := openStore(t, dir)
		m := New(Config{DefaultKernel: "fake", Languages: map[string]string{"python": "fake"}, Store: store, PoolSize: 1}, fakeSpecs(t), nil, nil)
		f := &fakeKernels{}
		m.start = f.start
		m.reconnect = func(context.Context, jupyter.ProvisionerInfo, jupyter.Config) (connecting, error) {
			return nil, errors.New("not adoptable here")
		}
		if _, err := m.Restore(context.Background()); err != nil {
			t.Fatal(err)
		}
		run(t, m, ExecuteRequest{Code: "print x"})
		run(t, m, ExecuteRequest{Code: "print y", Isolated: true})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if i%2 == 0 {
			within(t, "Manager.Detach", 15*time.Second, func() { m.Detach(ctx) })
		} else {
			within(t, "Manager.Close", 15*time.Second, func() { m.Close(ctx) })
		}
		cancel()
		store.Close()
	}
	leakcheck.Check(t, before)
}

// A kernel's last activity reaches the store a CheckpointInterval after
// the activity: a restart's cull timers go on from there.
func TestCheckpointWritesLastActivity(t *testing.T) {
	store := openStore(t, t.TempDir())
	defer store.Close()
	m := newFakeManager(t, Config{Store: store, PoolSize: 0, CheckpointInterval: 20 * time.Millisecond}, &fakeKernels{})
	c, err := m.CreateContext(context.Background(), ContextRequest{ID: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	k, _ := m.Kernel(c.KernelID())
	recorded := func() time.Time {
		for _, kr := range load(t, store).Kernels {
			if kr.ID == k.id {
				return kr.LastActivity
			}
		}
		return time.Time{}
	}
	lastAct := func() time.Time {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.lastAct
	}
	before := recorded()
	// Activity less than CheckpointInterval newer than the record is not
	// written; runs go on until one is that much newer, and it is.
	waitFor(t, "the runs' activity in the store", func() bool {
		run(t, m, ExecuteRequest{Code: "print hello", Context: "agent"})
		return recorded().After(before)
	})
	if got := recorded(); got.Sub(before) < 20*time.Millisecond || got.After(lastAct()) {
		t.Errorf("recorded last activity %v: want at least 20 ms after %v, not after %v", got, before, lastAct())
	}
}

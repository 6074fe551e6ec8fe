package sessions

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"kernelgate/runs"
	"kernelgate/state"
)

// A run its caller waits for (POST /api/execute answered with the whole
// Execution) hands its id out only with its end, so it commits nothing
// and waits for no commit: queued behind a busy run while the store's
// disk does not answer, it is listed in its context's processIds at once,
// runs and answers while the disk still does not, and its record (naming
// its kernel and request) reaches the store with the next commit. A run
// whose id leaves before its end (a streamed run, a 202) queued behind
// the same busy run is still committed before Execute returns it.
func TestWaitedRunWaitsForNoCommit(t *testing.T) {
	store := openHeldStore(t, state.Options{}, nil)
	counted := &commitCounter{Store: store}
	m := newRealManager(t, Config{Store: counted, PoolSize: 0})
	t.Cleanup(store.unhold) // before the manager and the store close

	ctx := context.Background()
	c, err := m.CreateContext(ctx, ContextRequest{ID: "waited", Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	gate := filepath.Join(t.TempDir(), "go")
	busy, err := m.Execute(ctx, ExecuteRequest{Context: c.ID,
		Code: fmt.Sprintf("import os, time\nwhile not os.path.exists(%q):\n    time.sleep(0.01)\n", gate)})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the busy run to start", func() bool { return busy.State() == runs.RunRunning })
	if err := store.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	// The disk stops answering; a waited-for run queues behind the busy one.
	store.hold()
	waitedBefore := counted.waited.Load()
	r, err := m.Execute(ctx, ExecuteRequest{Context: c.ID, Code: "1+1", Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := counted.waited.Load() - waitedBefore; n != 0 {
		t.Fatalf("the waited-for run waited for %d commits of its record before it was queued, want none", n)
	}
	if r.State() != runs.RunQueued {
		t.Fatalf("the waited-for run is %s, want queued behind the busy run", r.State())
	}
	if ids := c.Model().ProcessIDs; !slices.Contains(ids, r.ID) {
		t.Fatalf("the context's processIds %v do not list the queued run %s", ids, r.ID)
	}

	// It runs and answers while the disk still does not answer.
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := r.Wait(wctx); err != nil {
		t.Fatalf("the waited-for run did not end while the store was held: %v", err)
	}
	if e := execution(t, r); e.Process.Reason != runs.Completed || len(e.Results) != 1 || e.Results[0].Text != "2" {
		t.Fatalf("the waited-for run's Execution: %+v", e)
	}
	if n := counted.waited.Load() - waitedBefore; n != 0 {
		t.Fatalf("the waited-for run waited for %d commits, want none", n)
	}
	if m.journal.Stuck() {
		t.Fatal("the store was taken as stuck: a commit was waited for until the store's timeout")
	}
	select {
	case <-store.release:
		t.Fatal("the store was released before the waited-for run answered")
	default:
	}

	// Once the disk answers, its record reaches the store.
	store.unhold()
	waitFor(t, "the waited-for run's record in the store", func() bool {
		rec, ok := storedRun(t, store, r.ID)
		return ok && rec.State == runs.RunDone && rec.Kernel == c.KernelID() && rec.MsgID != ""
	})

	// A run whose id leaves before its end, queued behind a busy run,
	// is committed before Execute returns it.
	gate2 := gate + "2"
	busy2, err := m.Execute(ctx, ExecuteRequest{Context: c.ID,
		Code: fmt.Sprintf("import os, time\nwhile not os.path.exists(%q):\n    time.sleep(0.01)\n", gate2)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(gate2, nil, 0o600) })
	waitFor(t, "the second busy run to start", func() bool { return busy2.State() == runs.RunRunning })
	streamed, err := m.Execute(ctx, ExecuteRequest{Context: c.ID, Code: "2+2"})
	if err != nil {
		t.Fatal(err)
	}
	if rec, ok := storedRun(t, store, streamed.ID); !ok || rec.State != runs.RunQueued {
		t.Fatalf("the store holds the streamed run as %+v (found %v) when its id left, want it queued", rec, ok)
	}
	if ids := c.Model().ProcessIDs; !slices.Contains(ids, streamed.ID) {
		t.Fatalf("the context's processIds %v do not list the queued streamed run %s", ids, streamed.ID)
	}
}

// storedRun is the store's record of run id.
func storedRun(t *testing.T, s state.Store, id string) (runs.Record, bool) {
	t.Helper()
	snap, err := s.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, sr := range snap.Runs {
		if sr.ID == id {
			var rec runs.Record
			if err := json.Unmarshal(sr.Data, &rec); err != nil {
				t.Fatal(err)
			}
			return rec, true
		}
	}
	return runs.Record{}, false
}

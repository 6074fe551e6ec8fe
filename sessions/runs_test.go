package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"kernelgate/jupyter"
	"kernelgate/runs"
)

// recorded returns how many runs the manager keeps records of.
func recorded(m *Manager) (runs, order int) {
	st := m.runs.Stats()
	return st.Runs, st.Ordered
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
	waitFor(t, "the first run to start", func() bool { return first.State() == runs.RunRunning })
	queued, err := m.Execute(context.Background(), ExecuteRequest{Code: "print queued", Context: "q"})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := recorded(m)
	if _, err := m.Execute(context.Background(), ExecuteRequest{Code: "print refused", Context: "q"}); !errors.Is(err, runs.ErrQueueFull) {
		t.Fatalf("got %v, want ErrQueueFull", err)
	}
	if after, order := recorded(m); after != before || order != before {
		t.Errorf("a refused run was recorded: %d runs (%d in order) after, %d before", after, order, before)
	}
	interruptContext(m, context.Background(), "q")
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
	var last *runs.Run
	for i := 0; i < 20; i++ {
		last, _ = run(t, m, ExecuteRequest{Code: "print " + strings.Repeat("y", 10<<10)})
	}
	st := m.runs.Stats()
	if st.Runs >= 20 || st.Runs == 0 || st.Bytes > 64<<10 {
		t.Errorf("%d runs kept holding %d bytes, want fewer than 20 within 64 KiB", st.Runs, st.Bytes)
	}
	if _, err := m.Run(last.ID); err != nil {
		t.Errorf("the newest run was pruned: %v", err)
	}
}

// The run's events and its runs.Execution share one copy of the output, and
// say the same: the events read twice are the same bytes, their text is
// the runs.Execution's logs, their results its results (an updated display as
// it first was), and a kernel with no client keeps no replay of the run.
func TestRunHoldsOneCopyOfItsOutput(t *testing.T) {
	big := strings.Repeat("y", 1<<20)
	f := &fakeKernels{script: func(r *fakeRequest) {
		if r.Msg.Type() != jupyter.ExecuteRequest || r.Code() != "show" {
			fakeAnswer(r)
			return
		}
		r.Status(jupyter.StateBusy)
		r.Stream("a\n")
		display := func(t MsgType, v string) {
			r.IOPub(t, map[string]any{"data": map[string]string{"text/plain": v}, "metadata": map[string]any{}, "transient": map[string]string{"display_id": "d"}})
		}
		display(jupyter.DisplayData, "first")
		display(jupyter.UpdateDisplayData, "second")
		r.Stream(big)
		r.Result("5")
		r.Reply(map[string]any{"status": "ok"})
		r.Status(jupyter.StateIdle)
	}}
	m := newFakeManager(t, Config{}, f)
	r, e := run(t, m, ExecuteRequest{Code: "show"})

	evs, _, done := r.Events(0)
	again, _, _ := r.Events(0)
	if !done || len(evs) != len(again) {
		t.Fatalf("events: %d then %d, done %v", len(evs), len(again), done)
	}
	var stdout strings.Builder
	var results []string
	for i, ev := range evs {
		if string(ev.JSON) != string(again[i].JSON) || ev.Seq != i+1 {
			t.Fatalf("event %d differs between reads or has seq %d", i, ev.Seq)
		}
		var p struct {
			Text string `json:"text"`
		}
		json.Unmarshal(ev.JSON, &p)
		switch ev.Type {
		case "stdout":
			stdout.WriteString(p.Text)
		case "result":
			results = append(results, p.Text)
		}
	}
	if got := strings.Join(e.Logs.Stdout, ""); stdout.String() != got || got != "a\n"+big {
		t.Errorf("stdout events (%d bytes) and runs.Execution logs (%d bytes) differ", stdout.Len(), len(got))
	}
	if strings.Join(results, ",") != "first,5" {
		t.Errorf("result events %v, want first,5", results)
	}
	if len(e.Results) != 2 || e.Results[0].Text != "second" || e.Results[1].Text != "5" || !e.Results[1].IsMainResult {
		t.Errorf("Execution results %+v", e.Results)
	}
	if kept := r.Memory(); kept > 1<<20+64<<10 {
		t.Errorf("the run's record holds %d bytes for 1 MiB of output", kept)
	}
	k, err := m.Kernel(mustContext(t, m, "code-python").KernelID())
	if err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	replayed := k.offline.Bytes()
	k.mu.Unlock()
	if replayed > 64<<10 {
		t.Errorf("the replay buffer keeps %d bytes of the run's output", replayed)
	}
}

func mustContext(t *testing.T, m *Manager, id string) *Context {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.contexts[id]
	if c == nil {
		t.Fatalf("no context %s", id)
	}
	return c
}

// Run ids are UUIDs that sort in the order the runs were made (version 7:
// the time first), so that the store keeps adding and pruning run records
// at the ends of its keys.
func TestRunIDsSortInCreationOrder(t *testing.T) {
	m := newFakeManager(t, Config{}, &fakeKernels{})
	var ids []string
	for range 20 {
		r, _ := run(t, m, ExecuteRequest{Code: "print x"})
		ids = append(ids, r.ID)
	}
	for i, id := range ids {
		u, err := uuid.Parse(id)
		if err != nil || u.Version() != 7 || u.String() != id {
			t.Fatalf("run id %q: a version 7 UUID in canonical form expected (%v)", id, err)
		}
		if i > 0 && id <= ids[i-1] {
			t.Fatalf("run %d's id %s sorts before the id %s of the run made before it", i, id, ids[i-1])
		}
	}
}

// The runs.Execution of an ended run reads the same however often and wherever
// it is read (the answer, GET /api/runs/{id}, the store's record), and
// does not change when read again.
func TestEndedRunExecutionReadsTheSame(t *testing.T) {
	store := openStore(t, t.TempDir())
	defer store.Close()
	m := newFakeManager(t, Config{Store: store}, &fakeKernels{})
	r, e := run(t, m, ExecuteRequest{Code: "print hello"})
	first := string(r.ExecutionJSON())
	if model := r.Model(); string(model.Execution) != first || model.State != runs.RunDone {
		t.Fatalf("GET /api/runs/{id}: %s (%s), the answer: %s", model.Execution, model.State, first)
	}
	if err := store.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var rec runs.Record
	for _, kr := range load(t, store).Runs {
		if kr.ID == r.ID {
			json.Unmarshal(kr.Data, &rec)
		}
	}
	var kept runs.Execution
	if err := json.Unmarshal(rec.Execution, &kept); err != nil || kept.ID != r.ID || len(kept.Logs.Stdout) != 1 || kept.Logs.Stdout[0] != e.Logs.Stdout[0] {
		t.Fatalf("the store's runs.Execution %s (%v), want that of the answer %s", rec.Execution, err, first)
	}
	if again := string(r.ExecutionJSON()); again != first {
		t.Fatalf("read again: %s, first: %s", again, first)
	}
}

// Pruning keeps the runs in the order they were made: the unfinished runs
// it passes over stay ahead of the finished runs kept after them.
func TestPruningKeepsTheOrder(t *testing.T) {
	m := newFakeManager(t, Config{RunsKept: 4}, &fakeKernels{})
	var want []*runs.Run
	for i, id := range []string{"long1", "long2"} {
		if _, err := m.CreateContext(context.Background(), ContextRequest{ID: id}); err != nil {
			t.Fatal(err)
		}
		long, err := m.Execute(context.Background(), ExecuteRequest{Code: "sleep", Context: id})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, long)
		for range 3 + i {
			run(t, m, ExecuteRequest{Code: "print x"})
		}
	}
	for range 5 {
		r, _ := run(t, m, ExecuteRequest{Code: "print x"})
		want = append(want, r)
	}
	// RunsKept 4: the two unfinished runs and the newest finished ones.
	want = append(want[:2], want[len(want)-2:]...)
	got := m.runs.Runs()
	if len(got) != len(want) {
		t.Fatalf("%d runs kept, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("run %d kept is %s, want %s", i, got[i].ID, want[i].ID)
		}
		if _, err := m.Run(want[i].ID); err != nil {
			t.Fatalf("run %s is in the order but not kept: %v", want[i].ID, err)
		}
	}
}

// A context lists the ids of its runs still kept, oldest first.
func TestContextListsItsKeptRunsInOrder(t *testing.T) {
	m := newFakeManager(t, Config{RunsKept: 3}, &fakeKernels{})
	c, err := m.CreateContext(context.Background(), ContextRequest{ID: "c"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 7 {
		r, _ := run(t, m, ExecuteRequest{Code: "print x", Context: "c"})
		ids = append(ids, r.ID)
	}
	got := c.Model().ProcessIDs
	if want := ids[len(ids)-3:]; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("processIds %v, want %v", got, want)
	}
}

package sessions

import (
	"context"
	"encoding/json"
	"fmt"
	"kernelgate/runs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"kernelgate/state"
)

// commitCounter counts the commits of run records a manager waits for.
type commitCounter struct {
	state.Store
	waited atomic.Int32
}

func (s *commitCounter) CommitRun(ctx context.Context, id string, data []byte) error {
	s.waited.Add(1)
	return s.Store.CommitRun(ctx, id, data)
}

// A run's code goes to its kernel while its record is being committed:
// the disk and the kernel work at the same time. With the store's commit
// held, a run whose id leaves before its end (a streamed run, a 202) of
// code that writes a file sees the file appear and the run end; Execute
// returns it (its id) only once the commit is released, the run's end
// waited for the commit in flight rather than starting one of its own,
// and the store then holds the record naming the run's kernel and
// request. (A run its caller waits for commits nothing:
// TestWaitedRunWaitsForNoCommit.)
func TestCodeIsSentWhileTheRecordCommits(t *testing.T) {
	store := openHeldStore(t, state.Options{}, nil)
	counted := &commitCounter{Store: store}
	m := newRealManager(t, Config{Store: counted, PoolSize: 0})
	t.Cleanup(store.unhold) // before the manager and the store close

	ctx := context.Background()
	c, err := m.CreateContext(ctx, ContextRequest{ID: "overlap", Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	// The kernel is ready and its records are committed: the next commit
	// is the run's.
	first, _ := run(t, m, ExecuteRequest{Context: c.ID, Code: "1+1"})
	if err := store.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	file := filepath.Join(t.TempDir(), "ran")
	waitedBefore := counted.waited.Load()
	store.hold()
	type answer struct {
		r   *runs.Run
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		r, err := m.Execute(ctx, ExecuteRequest{Context: c.ID,
			Code: fmt.Sprintf("open(%q, 'w').write('x')", file)})
		if err == nil {
			err = r.Wait(ctx)
		}
		answered <- answer{r, err}
	}()
	select {
	case <-store.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the store's writer did not commit the run's record")
	}
	waitFor(t, "the kernel to run the code while the run's record is being committed", func() bool {
		_, err := os.Stat(file)
		return err == nil
	})
	// The run ends while its commit is held (its id is not out yet: it
	// is the manager's newest run).
	all := m.runs.Runs()
	r := all[len(all)-1]
	if r == first {
		t.Fatal("the run is not among the manager's runs")
	}
	waitFor(t, "the run to end while its record is being committed", func() bool {
		_, ended := r.End()
		return ended
	})
	select {
	case a := <-answered:
		t.Fatalf("Execute returned (run %s, err %v) while the run's record was not committed", a.r.ID, a.err)
	case <-r.Done():
		t.Fatal("the run was done (its answer could go) while its record was not committed")
	default:
	}

	store.unhold()
	var a answer
	select {
	case a = <-answered:
	case <-time.After(30 * time.Second):
		t.Fatal("Execute did not return once the commit was released")
	}
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.r != r {
		t.Fatalf("answered run %s, want %s", a.r.ID, r.ID)
	}
	if n := counted.waited.Load() - waitedBefore; n != 0 {
		t.Fatalf("the run waited for %d commits of its record, want none: its end waits for the commit in flight", n)
	}
	snap, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sr := range snap.Runs {
		if sr.ID != r.ID {
			continue
		}
		var rec runs.Record
		if err := json.Unmarshal(sr.Data, &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Kernel != c.KernelID() || rec.MsgID == "" || rec.State != runs.RunDone {
			t.Fatalf("the store holds the run as %+v, want it done on kernel %s with its request", rec, c.KernelID())
		}
		return
	}
	t.Fatalf("the store has no record of run %s", r.ID)
}

// A disk that does not answer holds a run whose id leaves before its end
// up by storeTimeout at most, as before: the code of the run whose
// commit hangs still goes to the kernel at once and its output comes;
// Execute returns it once the commit's wait runs out, the store is then
// taken as stuck, and the next such run is returned while the disk
// still does not answer. Once the disk answers, both runs' records reach
// the store.
func TestHungCommitHoldsTheAnswerOnlyUntilTheStoreTimeout(t *testing.T) {
	store := openHeldStore(t, state.Options{}, nil)
	m := newRealManager(t, Config{Store: store, PoolSize: 0})
	t.Cleanup(store.unhold)

	ctx := context.Background()
	c, err := m.CreateContext(ctx, ContextRequest{ID: "hung", Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, ExecuteRequest{Context: c.ID, Code: "1+1"})
	store.hold()
	answered := make(chan *runs.Run, 1)
	go func() {
		r, err := m.Execute(ctx, ExecuteRequest{Context: c.ID, Code: "print('out')"})
		if err == nil {
			err = r.Wait(ctx)
		}
		if err != nil {
			t.Error(err)
			r = nil
		}
		answered <- r
	}()
	var r *runs.Run
	select {
	case r = <-answered:
	case <-time.After(storeTimeout + 30*time.Second):
		t.Fatal("the run never answered while the store's commit was held")
	}
	if r == nil {
		return
	}
	if got := strings.Join(execution(t, r).Logs.Stdout, ""); got != "out\n" {
		t.Fatalf("the run's stdout is %q, want %q", got, "out\n")
	}
	if !m.journal.Stuck() {
		t.Fatal("a commit that did not come in time did not mark the store stuck")
	}
	select {
	case <-store.release:
		t.Fatal("the store was released before the run answered")
	default:
	}
	// The store is stuck: the next run does not wait for it.
	next, err := m.Execute(ctx, ExecuteRequest{Context: c.ID, Code: "2+2"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-store.release:
		t.Fatal("the store was released before the next run answered")
	default:
	}

	store.unhold()
	waitFor(t, "both runs' records in the store", func() bool {
		snap, err := store.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		done := 0
		for _, sr := range snap.Runs {
			if (sr.ID == r.ID || sr.ID == next.ID) && strings.Contains(string(sr.Data), `"state":"done"`) {
				done++
			}
		}
		return done == 2
	})
	waitFor(t, "the store to be taken as committing again", func() bool { return !m.journal.Stuck() })
}

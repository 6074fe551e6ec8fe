package state

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// heldStore is a Bolt store whose writer can be held in its next commit,
// as a disk that does not answer holds it.
type heldStore struct {
	*Bolt
	hold    atomic.Bool
	held    chan struct{} // a commit is held
	release chan struct{}
	once    sync.Once
	commits atomic.Int32
}

func openHeld(t *testing.T, maxQueued int) *heldStore {
	t.Helper()
	h := &heldStore{held: make(chan struct{}, 1), release: make(chan struct{})}
	b, err := Open(filepath.Join(t.TempDir(), FileName), Options{MaxQueued: maxQueued, BeforeCommit: func(int) {
		h.commits.Add(1)
		if h.hold.Load() {
			select {
			case h.held <- struct{}{}:
			default:
			}
			<-h.release
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	h.Bolt = b
	t.Cleanup(func() { h.unhold(); b.Close() })
	return h
}

// holdNext holds the writer in its next commit and waits until it is.
func (h *heldStore) holdNext(t *testing.T) {
	t.Helper()
	h.hold.Store(true)
	go h.Flush(context.Background())
	select {
	case <-h.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the writer did not commit")
	}
}

func (h *heldStore) unhold() { h.once.Do(func() { h.hold.Store(false); close(h.release) }) }

// queuedOps is how many writes wait for the writer.
func (h *heldStore) queuedOps() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.queue)
}

// While the disk does not answer, run writes return at once: queued up to
// the bound, refused with ErrBusy past it; deletes and CommitRun are
// still queued. Once it answers, what was queued is written.
func TestRunWritesNeverWaitForTheDisk(t *testing.T) {
	const bound = 64 << 10
	s := openHeld(t, bound)
	s.holdNext(t)
	ev := make([]byte, 1000)
	accepted, refused := 0, 0
	for seq := uint64(1); seq <= 200; seq++ {
		done := make(chan error, 1)
		go func() { done <- s.AppendRunEvents("r1", Event{seq, ev}) }()
		select {
		case err := <-done:
			switch {
			case err == nil:
				accepted++
			case errors.Is(err, ErrBusy):
				refused++
			default:
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("AppendRunEvents waited for the held disk (write %d)", seq)
		}
	}
	if accepted == 0 || refused == 0 || accepted*len(ev) > bound {
		t.Fatalf("%d writes of %d bytes queued and %d refused, want the queue to stop at %d bytes", accepted, len(ev), refused, bound)
	}
	if err := s.PutRun("r1", make([]byte, 2000)); !errors.Is(err, ErrBusy) {
		t.Fatalf("PutRun past the bound: %v, want ErrBusy", err)
	}
	if err := s.DeleteRun("gone"); err != nil {
		t.Fatalf("DeleteRun past the bound: %v", err)
	}
	committed := make(chan error, 1)
	go func() { committed <- s.CommitRun(context.Background(), "r2", []byte(`{"kept":true}`)) }()
	select {
	case err := <-committed:
		t.Fatalf("CommitRun returned while the disk was held: %v", err)
	default:
	}
	s.unhold()
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	snap, err := s.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Run{}
	for _, r := range snap.Runs {
		got[r.ID] = r
	}
	if len(got["r1"].Events) != accepted || string(got["r2"].Data) != `{"kept":true}` {
		t.Fatalf("after the disk answered: r1 has %d events (want %d), r2 %q", len(got["r1"].Events), accepted, got["r2"].Data)
	}
}

// Runs committed while a commit is in progress share the next one.
func TestCommitRunsShareACommit(t *testing.T) {
	s := openHeld(t, 0)
	s.holdNext(t)
	const runs = 8
	errs := make(chan error, runs)
	for i := range runs {
		go func() { errs <- s.CommitRun(context.Background(), string(rune('a'+i)), []byte("{}")) }()
	}
	waitUntil(t, func() bool { return s.queuedOps() >= runs }, fmt.Sprintf("%d commits to be queued", runs))
	before := s.commits.Load()
	s.unhold()
	for range runs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := s.commits.Load() - before; n != 1 {
		t.Fatalf("%d runs committed together took %d commits, want 1", runs, n)
	}
}

package sessions

import (
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"kernelgate/state"
)

// heldStore is a bbolt store whose commits can be held, as a disk that
// stops answering holds them: after hold, the writer's next commit waits
// (and says so on held) until unhold.
type heldStore struct {
	*state.Bolt
	holding atomic.Bool
	release chan struct{}
	held    chan struct{}
	once    sync.Once
}

// openHeldStore opens a heldStore with opts, closed at the end of the
// test. onCommit, when given, sees each commit's size first, and whether
// a commit was held before it. The caller registers unhold as a cleanup
// once its manager is made, so that it runs before the manager and the
// store close.
func openHeldStore(t *testing.T, opts state.Options, onCommit func(n int, afterHeld bool)) *heldStore {
	t.Helper()
	s := &heldStore{release: make(chan struct{}), held: make(chan struct{}, 1)}
	var heldOne atomic.Bool
	opts.BeforeCommit = func(n int) {
		if onCommit != nil {
			onCommit(n, heldOne.Load())
		}
		if s.holding.Load() {
			heldOne.Store(true)
			select {
			case s.held <- struct{}{}:
			default:
			}
			<-s.release
		}
	}
	b, err := state.Open(filepath.Join(t.TempDir(), state.FileName), opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Bolt = b
	t.Cleanup(func() { b.Close() })
	return s
}

// hold makes the writer's next commit wait.
func (s *heldStore) hold() { s.holding.Store(true) }

// unhold lets every commit go, for good.
func (s *heldStore) unhold() { s.once.Do(func() { s.holding.Store(false); close(s.release) }) }

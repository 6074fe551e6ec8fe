package state

import (
	"context"
	"errors"
	"testing"
	"time"
)

// CommitRunAsync returns at once while the disk does not answer, even
// past the queue's bound, and tells its callback once the record is
// durable (it is then in the file), after the writes queued before it.
func TestCommitRunAsyncReturnsBeforeTheDisk(t *testing.T) {
	const bound = 8 << 10
	s := openHeld(t, bound)
	s.holdNext(t)
	// Fill the queue to its bound: run writes are refused now.
	for seq := uint64(1); ; seq++ {
		if err := s.AppendRunEvents("before", Event{seq, make([]byte, 1000)}); errors.Is(err, ErrBusy) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	acked := make(chan error, 1)
	calls := 0
	returned := make(chan error, 1)
	go func() {
		returned <- s.CommitRunAsync("r", []byte(`{"sent":true}`), func(err error) { calls++; acked <- err })
	}()
	select {
	case err := <-returned:
		if err != nil {
			t.Fatalf("CommitRunAsync past the bound: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("CommitRunAsync waited for the held disk")
	}
	select {
	case err := <-acked:
		t.Fatalf("the commit was acknowledged while the disk was held (%v)", err)
	default:
	}
	s.unhold()
	select {
	case err := <-acked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the commit was never acknowledged once the disk answered")
	}
	// The file holds it: read it without the store's queue.
	s.Close()
	b, err := Open(s.Path(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	snap, err := b.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got, before *Run
	for i := range snap.Runs {
		switch snap.Runs[i].ID {
		case "r":
			got = &snap.Runs[i]
		case "before":
			before = &snap.Runs[i]
		}
	}
	if got == nil || string(got.Data) != `{"sent":true}` || before == nil || len(before.Events) == 0 {
		t.Fatalf("after the acknowledgement the file holds r = %v and the writes queued before it = %v", got, before)
	}
	if calls != 1 {
		t.Fatalf("done was called %d times, want 1", calls)
	}
	if err := s.CommitRunAsync("late", []byte("{}"), func(error) { t.Error("done called for a refused commit") }); !errors.Is(err, ErrClosed) {
		t.Fatalf("CommitRunAsync on a closed store: %v, want ErrClosed", err)
	}
}

// The memory store acknowledges at once.
func TestMemoryCommitRunAsync(t *testing.T) {
	s := NewMemory()
	acked := false
	if err := s.CommitRunAsync("r", []byte("{}"), func(err error) { acked = err == nil }); err != nil || !acked {
		t.Fatalf("CommitRunAsync: %v, acknowledged %v", err, acked)
	}
	if err := s.CommitRunAsync("", []byte("{}"), func(error) { t.Error("done called for an invalid record") }); !errors.Is(err, ErrInvalid) {
		t.Fatalf("CommitRunAsync without an id: %v, want ErrInvalid", err)
	}
}

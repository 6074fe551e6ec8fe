package mcp

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// serveTaking serves one request through b whose handler runs f with the
// request's context, and returns when the request has been answered.
func serveTaking(b *readBudget, f func(ctx context.Context)) {
	b.serve(httptest.NewRecorder(), httptest.NewRequest("POST", "/mcp", nil),
		http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { f(r.Context()) }))
}

// full reports whether the budget has no byte left.
func full(b *readBudget) bool {
	if b.sem.TryAcquire(1) {
		b.sem.Release(1)
		return false
	}
	return true
}

// What a call takes is held until its request has been answered; a call
// past the budget waits for it, and goes on once it is back.
func TestReadBudgetHeldUntilAnswered(t *testing.T) {
	b := newReadBudget(10)
	answer := make(chan struct{})
	taken := make(chan struct{})
	first := make(chan struct{})
	go func() {
		defer close(first)
		serveTaking(b, func(ctx context.Context) {
			if _, err := b.take(ctx, 10); err != nil {
				t.Error(err)
			}
			close(taken)
			<-answer // the answer is being written
		})
	}()
	<-taken
	second := make(chan error, 1)
	go serveTaking(b, func(ctx context.Context) {
		_, err := b.take(ctx, 4)
		second <- err
	})
	if !full(b) {
		t.Fatal("a call holds the whole budget, yet there is room")
	}
	select {
	case err := <-second:
		t.Fatalf("a call past the budget went on (%v) while the first was answered", err)
	default:
	}
	close(answer)
	<-first
	select {
	case err := <-second:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting call did not go on when the first request was answered")
	}
	waitFor(t, "the budget back whole", func() bool { return b.sem.TryAcquire(10) })
}

// A waiting call whose client gives up takes nothing; a call larger than
// the whole budget takes all of it; a call outside a request gives back
// when done, one within a request only once the request is answered.
func TestReadBudgetCancelLargeDone(t *testing.T) {
	b := newReadBudget(10)
	done, err := b.take(context.Background(), 100)
	if err != nil || !full(b) {
		t.Fatalf("a call over the budget: %v, full %v; want it to take the whole budget", err, full(b))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.take(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("take with a cancelled context = %v", err)
	}
	done()
	if full(b) {
		t.Fatal("done outside a request did not give the budget back")
	}
	serveTaking(b, func(ctx context.Context) {
		done, err := b.take(ctx, 6)
		if err != nil {
			t.Fatal(err)
		}
		done() // the answer is not written yet
		if b.sem.TryAcquire(5) {
			t.Fatal("a call's part of the budget went back before its request was answered")
		}
	})
	if !b.sem.TryAcquire(10) {
		t.Fatal("the budget is not whole after the request")
	}
}

// The calls of one JSON-RPC batch never wait while the batch holds part of
// the budget: a later call takes what is left or is refused at once.
func TestReadBudgetBatch(t *testing.T) {
	b := newReadBudget(10)
	serveTaking(b, func(ctx context.Context) {
		if _, err := b.take(ctx, 6); err != nil {
			t.Fatal(err)
		}
		if _, err := b.take(ctx, 3); err != nil {
			t.Fatalf("a second call of the batch that fits: %v", err)
		}
		if _, err := b.take(ctx, 3); !errors.Is(err, ErrReadsBusy) {
			t.Fatalf("a third call past the budget = %v, want ErrReadsBusy", err)
		}
	})
	if !b.sem.TryAcquire(10) {
		t.Fatal("the batch's calls did not give back")
	}
}

// A call that gets its turn after its request was answered (its client
// went away) gives back at once.
func TestReadBudgetAfterRequestEnded(t *testing.T) {
	b := newReadBudget(10)
	var late context.Context
	serveTaking(b, func(ctx context.Context) { late = ctx })
	if _, err := b.take(late, 5); !errors.Is(err, errRequestEnded) {
		t.Fatalf("take after the request ended = %v", err)
	}
	if !b.sem.TryAcquire(10) {
		t.Fatal("a call after its request ended kept part of the budget")
	}
}

// waitFor polls ok until it holds, failing after a deadline.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for !ok() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: not within 10s", what)
		}
	}
}

// deadlineRecorder is a response writer that records the write deadlines
// set on it.
type deadlineRecorder struct {
	*httptest.ResponseRecorder
	deadlines []time.Time
}

func (d *deadlineRecorder) SetWriteDeadline(t time.Time) error {
	d.deadlines = append(d.deadlines, t)
	return nil
}

// A request whose call holds part of the budget gets a write deadline,
// cleared once it is answered (the connection may serve another request).
func TestReadBudgetWriteDeadline(t *testing.T) {
	b := newReadBudget(10)
	w := &deadlineRecorder{ResponseRecorder: httptest.NewRecorder()}
	b.serve(w, httptest.NewRequest("POST", "/mcp", nil), http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if _, err := b.take(r.Context(), 5); err != nil {
			t.Fatal(err)
		}
		if len(w.deadlines) != 1 || time.Until(w.deadlines[0]) <= 0 || time.Until(w.deadlines[0]) > answerWriteTime {
			t.Fatalf("write deadlines %v while the call holds the budget; want one within %v", w.deadlines, answerWriteTime)
		}
	}))
	if len(w.deadlines) != 2 || !w.deadlines[1].IsZero() {
		t.Fatalf("write deadlines %v; want the first cleared after the answer", w.deadlines)
	}
	// A request that takes nothing keeps the connection as it is.
	w = &deadlineRecorder{ResponseRecorder: httptest.NewRecorder()}
	b.serve(w, httptest.NewRequest("POST", "/mcp", nil), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	if len(w.deadlines) != 0 {
		t.Fatalf("write deadlines %v of a request without reads", w.deadlines)
	}
}

// A client that does not read its answer loses its connection after the
// write time, and the budget it held goes to the calls waiting.
func TestReadBudgetSlowReader(t *testing.T) {
	b := newReadBudget(10)
	b.writeTime = 200 * time.Millisecond
	big := make([]byte, 64<<20) // more than the sockets' buffers hold
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.serve(w, r, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := b.take(r.Context(), 10); err != nil {
				t.Error(err)
				return
			}
			w.Write(big)
		}))
	}))
	defer srv.Close()
	resp, err := http.Get(srv.URL) // its body is never read
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if !full(b) {
		t.Fatal("the slow reader's call does not hold the budget")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.take(ctx, 10); err != nil {
		t.Fatalf("a call waiting behind a client that does not read: %v", err)
	}
}

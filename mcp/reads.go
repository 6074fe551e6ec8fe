package mcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
)

// The answer of a read_file call is built in memory: the file's text (or
// its base64), the tool result's JSON and the JSON-RPC message around it
// are each a copy of about the content's size, and they live until the
// HTTP answer is written. readBudget bounds what calls hold at once: a
// call takes its content's length from the budget before reading the file
// into memory and gives it back when its HTTP request has been answered.
// Calls past the budget wait their turn, in arrival order, until their
// client gives up; so the gateway's memory does not grow with the number
// of parallel reads. A client must read an answer within answerWriteTime
// (its connection is cut otherwise): one that does not read cannot keep
// the budget from the others.

// answerWriteTime is how long the answer of a request whose calls hold
// part of the budget may take to write.
const answerWriteTime = 2 * time.Minute

// ErrReadsBusy refuses a second read_file of one JSON-RPC batch when the
// budget is taken: waiting while the batch holds the first could wait for
// ever.
var ErrReadsBusy = errors.New("mcp: the read_file calls in flight hold all the memory they may")

// errRequestEnded is the error of a call whose HTTP request was answered
// (its client went away) before the call had its turn.
var errRequestEnded = errors.New("mcp: the request ended before the file was read")

// readBudget is the budget of what read_file calls hold.
type readBudget struct {
	sem       *semaphore.Weighted
	size      int64
	writeTime time.Duration // answerWriteTime
}

func newReadBudget(size int64) *readBudget {
	return &readBudget{sem: semaphore.NewWeighted(size), size: size, writeTime: answerWriteTime}
}

// readHold is what the read_file calls of one HTTP request took from the
// budget.
type readHold struct {
	rc *http.ResponseController

	mu       sync.Mutex
	started  bool  // a call took, or is waiting to take, from the budget
	ended    bool  // the request was answered: what is held went back
	n        int64 // what is held
	setting  int   // calls setting the write deadline now
	deadline bool  // the answer has a write deadline
}

type holdKey struct{}

// serve serves an HTTP request with next, giving back what its calls took
// from the budget once next has written the answer.
func (b *readBudget) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	hold := &readHold{rc: http.NewResponseController(w)}
	defer b.end(hold)
	next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), holdKey{}, hold)))
}

// end gives back what hold took; calls that take after it give back at
// once. The connection's write deadline is cleared for its next request,
// here or by a call still setting it.
func (b *readBudget) end(hold *readHold) {
	hold.mu.Lock()
	n := hold.n
	hold.n, hold.ended = 0, true
	clear := hold.deadline && hold.setting == 0
	hold.mu.Unlock()
	if n > 0 {
		b.sem.Release(n)
	}
	if clear {
		hold.rc.SetWriteDeadline(time.Time{})
	}
}

// limitWrite gives the request's answer a write deadline of d from now.
func (hold *readHold) limitWrite(d time.Duration) {
	hold.mu.Lock()
	hold.setting++
	hold.mu.Unlock()
	err := hold.rc.SetWriteDeadline(time.Now().Add(d))
	hold.mu.Lock()
	hold.setting--
	hold.deadline = hold.deadline || err == nil
	clear := hold.ended && hold.deadline && hold.setting == 0
	hold.mu.Unlock()
	if clear {
		hold.rc.SetWriteDeadline(time.Time{})
	}
}

// take takes n bytes from the budget for a call of ctx's request, waiting
// for them while ctx lives; a call larger than the whole budget takes all
// of it. What it took goes back when the request has been answered, after
// the call's answer was written. done marks the end of the call: it gives
// back only for a call outside serve, which has no request to wait for.
func (b *readBudget) take(ctx context.Context, n int64) (done func(), err error) {
	n = min(n, b.size)
	hold, _ := ctx.Value(holdKey{}).(*readHold)
	if hold == nil {
		if err := b.sem.Acquire(ctx, n); err != nil {
			return nil, err
		}
		return func() { b.sem.Release(n) }, nil
	}
	hold.mu.Lock()
	first := !hold.started
	hold.started = true
	hold.mu.Unlock()
	if first {
		if err := b.sem.Acquire(ctx, n); err != nil {
			return nil, err
		}
	} else if !b.sem.TryAcquire(n) {
		return nil, fmt.Errorf("%w: call read_file again, one call per request", ErrReadsBusy)
	}
	hold.mu.Lock()
	ended := hold.ended
	if !ended {
		hold.n += n
	}
	hold.mu.Unlock()
	if ended {
		b.sem.Release(n)
		return nil, errRequestEnded
	}
	hold.limitWrite(b.writeTime)
	return func() {}, nil
}

package state

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"
)

type opKind uint8

const (
	opPut opKind = iota
	opDelete
	opPutRun
	opEvents
	opDeleteRun
	opBarrier // Flush: nothing to write
)

// op is one queued write.
type op struct {
	kind   opKind
	bucket []byte // the bucket, or the table, of a record
	key    string
	val    []byte
	events []Event
	ack    chan error // durable writes and Flush; nil for run writes
	// done, instead of ack, is told the commit's outcome (CommitRunAsync):
	// called by the writer, it never blocks.
	done func(error)
	// fence, when set, is the lease the write is made under (Fenced);
	// the commit sets fenced when it refused the write for it.
	fence  *Fence
	fenced bool
}

// durable says the op is committed at once and acknowledged: never
// refused for a full queue.
func (o *op) durable() bool { return o.ack != nil || o.done != nil }

func (o *op) size() int {
	n := len(o.key) + len(o.val) + 64
	for _, e := range o.events {
		n += len(e.Data) + 16
	}
	return n
}

// writeQueue is a store's queue of writes and the one goroutine that
// commits them, in call order; Bolt and Postgres embed it, each with the
// commit of its own kind. A durable write (a kernel, context, session or
// sandbox, CommitRun, CommitRunAsync or Flush) is committed at once, with
// whatever is queued before it; run writes wait up to Options.FlushDelay
// for company. Durable writes that come while a commit is under way share
// the next one (group commit). Run writes never wait for the commit:
// past Options.MaxQueued queued bytes they are refused with ErrBusy.
type writeQueue struct {
	opts Options
	log  *slog.Logger
	// commit writes a batch, all of it or none, and says how it went;
	// called by the writer only.
	commit func([]op) error

	mu      sync.Mutex
	queue   []op
	queued  int  // bytes in queue
	urgent  bool // a durable write or Flush waits in queue
	closed  bool
	wake    chan struct{} // cap 1: the queue changed
	stopped chan struct{} // closed when the writer has ended
}

// newWriteQueue returns the queue of a store that commits with commit;
// its owner starts writer.
func newWriteQueue(opts Options, commit func([]op) error) writeQueue {
	return writeQueue{opts: opts, log: opts.Logger, commit: commit,
		wake: make(chan struct{}, 1), stopped: make(chan struct{})}
}

// enqueue adds o to the queue. It never waits: a run write (but a
// delete, which is small) that would take the queue over its bound is
// refused with ErrBusy, so that a disk or a database that does not
// answer never holds up the caller (a kernel's reader).
func (q *writeQueue) enqueue(o op) error {
	size := o.size()
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrClosed
	}
	if !o.durable() && o.kind != opDeleteRun && q.queued > 0 && q.queued+size > q.opts.MaxQueued {
		q.mu.Unlock()
		return ErrBusy
	}
	// The writer needs waking only when it sleeps on an empty queue, or
	// to commit at once: a run write joining others already queued waits
	// for their commit without a switch to the writer.
	wake := len(q.queue) == 0 || o.durable()
	q.queue = append(q.queue, o)
	q.queued += size
	q.urgent = q.urgent || o.durable()
	wake = wake || q.full()
	q.mu.Unlock()
	if wake {
		q.poke()
	}
	return nil
}

// poke wakes the writer, unless a wake is already pending.
func (q *writeQueue) poke() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// full says the queue is half its bound: worth a commit without waiting.
// The caller holds q.mu.
func (q *writeQueue) full() bool { return q.queued >= q.opts.MaxQueued/2 }

// durable enqueues o and waits for its commit.
func (q *writeQueue) durable(ctx context.Context, o op) error {
	o.ack = make(chan error, 1)
	if err := q.enqueue(o); err != nil {
		return err
	}
	select {
	case err := <-o.ack:
		return err
	case <-ctx.Done():
		// It stays queued and will be committed; the caller stops waiting.
		return ctx.Err()
	}
}

// writer is the one goroutine that commits. It tells each durable write
// its commit's outcome after the commit, in queue order, never under mu.
// Once the queue is closed it commits what is left and ends.
func (q *writeQueue) writer() {
	defer close(q.stopped)
	var timer *time.Timer
	for {
		q.mu.Lock()
		n, urgent, closed := len(q.queue), q.urgent || q.full(), q.closed
		q.mu.Unlock()
		switch {
		case n == 0 && closed:
			return
		case n == 0:
			<-q.wake
			continue
		case !urgent && !closed:
			// Run writes only: give others FlushDelay to join them,
			// unless a durable write arrives first.
			if timer == nil {
				timer = time.NewTimer(q.opts.FlushDelay)
			} else {
				timer.Reset(q.opts.FlushDelay)
			}
		wait:
			for {
				select {
				case <-timer.C:
					break wait
				case <-q.wake:
					q.mu.Lock()
					u, c := q.urgent || q.full(), q.closed
					q.mu.Unlock()
					if u || c {
						timer.Stop()
						break wait
					}
				}
			}
		}
		q.mu.Lock()
		batch, bytes := q.queue, q.queued
		q.queue, q.queued, q.urgent = nil, 0, false
		q.mu.Unlock()
		if q.opts.BeforeCommit != nil {
			q.opts.BeforeCommit(bytes)
		}
		err := q.commit(batch)
		lost, fenced := 0, 0
		for _, o := range batch {
			oerr := err
			if err == nil && o.fenced {
				oerr = fencedError(o.fence)
			}
			switch {
			case o.ack != nil:
				o.ack <- oerr
			case o.done != nil:
				o.done(oerr)
			case o.kind != opBarrier && err != nil:
				lost++
			case o.kind != opBarrier && oerr != nil:
				fenced++
			}
		}
		if lost > 0 {
			q.log.Error("state: run records were not written", "count", lost, "err", err)
		}
		if fenced > 0 {
			q.log.Warn("state: run records written under a lease not held were refused", "count", fenced)
		}
	}
}

// closeQueue refuses further writes (ErrClosed), lets the writer commit
// what is queued and waits for it to end. It says whether this call
// closed the queue (false: an earlier one did).
func (q *writeQueue) closeQueue() (first bool) {
	q.mu.Lock()
	first = !q.closed
	q.closed = true
	q.mu.Unlock()
	q.poke()
	<-q.stopped
	return first
}

// queueWriter is the Writer of a queue, its writes made under fence (nil:
// none).
type queueWriter struct {
	q     *writeQueue
	fence *Fence
}

var _ Writer = queueWriter{}

func (w queueWriter) putRecord(ctx context.Context, bucket []byte, id string, v any) error {
	if id == "" {
		return ErrInvalid
	}
	val, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return w.q.durable(ctx, op{kind: opPut, bucket: bucket, key: id, val: val, fence: w.fence})
}

func (w queueWriter) deleteRecord(ctx context.Context, bucket []byte, id string) error {
	return w.q.durable(ctx, op{kind: opDelete, bucket: bucket, key: id, fence: w.fence})
}

func (w queueWriter) PutKernel(ctx context.Context, k Kernel) error {
	return w.putRecord(ctx, bucketKernels, k.ID, k)
}
func (w queueWriter) DeleteKernel(ctx context.Context, id string) error {
	return w.deleteRecord(ctx, bucketKernels, id)
}
func (w queueWriter) PutContext(ctx context.Context, c Context) error {
	return w.putRecord(ctx, bucketContexts, c.ID, c)
}
func (w queueWriter) DeleteContext(ctx context.Context, id string) error {
	return w.deleteRecord(ctx, bucketContexts, id)
}
func (w queueWriter) PutSession(ctx context.Context, s Session) error {
	return w.putRecord(ctx, bucketSessions, s.ID, s)
}
func (w queueWriter) DeleteSession(ctx context.Context, id string) error {
	return w.deleteRecord(ctx, bucketSessions, id)
}
func (w queueWriter) PutSandbox(ctx context.Context, s Sandbox) error {
	return w.putRecord(ctx, bucketSandboxes, s.ID, s)
}
func (w queueWriter) DeleteSandbox(ctx context.Context, id string) error {
	return w.deleteRecord(ctx, bucketSandboxes, id)
}

// PutRun queues the run's data; the caller may reuse data after it
// returns only if it does not change it (it is not copied).
func (w queueWriter) PutRun(id string, data []byte) error {
	if id == "" {
		return ErrInvalid
	}
	return w.q.enqueue(op{kind: opPutRun, key: id, val: data, fence: w.fence})
}

// CommitRun is PutRun waited for: it is committed at once, with what is
// queued, and never refused for a full queue.
func (w queueWriter) CommitRun(ctx context.Context, id string, data []byte) error {
	if id == "" {
		return ErrInvalid
	}
	return w.q.durable(ctx, op{kind: opPutRun, key: id, val: data, fence: w.fence})
}

// CommitRunAsync is CommitRun not waited for: it is committed at once,
// with what is queued, and never refused for a full queue; the writer
// calls done with the commit's outcome (nil once it and every write
// queued before it are committed; for Postgres, while the database is
// down, once it is back). When it returns an error nothing was queued
// and done is never called.
func (w queueWriter) CommitRunAsync(id string, data []byte, done func(error)) error {
	if id == "" {
		return ErrInvalid
	}
	return w.q.enqueue(op{kind: opPutRun, key: id, val: data, done: done, fence: w.fence})
}

// AppendRunEvents queues the events; their Data is not copied.
func (w queueWriter) AppendRunEvents(id string, events ...Event) error {
	if id == "" {
		return ErrInvalid
	}
	return w.q.enqueue(op{kind: opEvents, key: id, events: events, fence: w.fence})
}

func (w queueWriter) DeleteRun(id string) error {
	return w.q.enqueue(op{kind: opDeleteRun, key: id, fence: w.fence})
}

// Flush returns once every write queued before it is committed: the
// writer commits in order.
func (w queueWriter) Flush(ctx context.Context) error {
	return w.q.durable(ctx, op{kind: opBarrier})
}

// The queue's own writes are made under no fence.

func (q *writeQueue) w() queueWriter { return queueWriter{q: q} }

func (q *writeQueue) PutKernel(ctx context.Context, k Kernel) error { return q.w().PutKernel(ctx, k) }
func (q *writeQueue) DeleteKernel(ctx context.Context, id string) error {
	return q.w().DeleteKernel(ctx, id)
}
func (q *writeQueue) PutContext(ctx context.Context, c Context) error {
	return q.w().PutContext(ctx, c)
}
func (q *writeQueue) DeleteContext(ctx context.Context, id string) error {
	return q.w().DeleteContext(ctx, id)
}
func (q *writeQueue) PutSession(ctx context.Context, s Session) error {
	return q.w().PutSession(ctx, s)
}
func (q *writeQueue) DeleteSession(ctx context.Context, id string) error {
	return q.w().DeleteSession(ctx, id)
}
func (q *writeQueue) PutSandbox(ctx context.Context, s Sandbox) error {
	return q.w().PutSandbox(ctx, s)
}
func (q *writeQueue) DeleteSandbox(ctx context.Context, id string) error {
	return q.w().DeleteSandbox(ctx, id)
}
func (q *writeQueue) PutRun(id string, data []byte) error { return q.w().PutRun(id, data) }
func (q *writeQueue) CommitRun(ctx context.Context, id string, data []byte) error {
	return q.w().CommitRun(ctx, id, data)
}
func (q *writeQueue) CommitRunAsync(id string, data []byte, done func(error)) error {
	return q.w().CommitRunAsync(id, data, done)
}
func (q *writeQueue) AppendRunEvents(id string, events ...Event) error {
	return q.w().AppendRunEvents(id, events...)
}
func (q *writeQueue) DeleteRun(id string) error       { return q.w().DeleteRun(id) }
func (q *writeQueue) Flush(ctx context.Context) error { return q.w().Flush(ctx) }

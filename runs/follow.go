package runs

import (
	"context"
	"errors"
	"sync"
	"time"

	"kernelgate/jupyter"
)

// LostOutputMarker is the text a run picked up after a restart of the
// gateway gets on stderr: ZeroMQ drops what a kernel publishes while no
// gateway subscribes.
const LostOutputMarker = "\n[kernelgate] the gateway restarted during this run: output the kernel published while no gateway was running, or just before the restart, is lost\n"

// Followed is a kernel an earlier gateway sent a run to, as the run's
// queue follows it to its end after a restart of the gateway (PickUp).
type Followed interface {
	// Route hands the messages of request msgID to h, and shows the
	// kernel busy, until undo is called.
	Route(msgID string, h func(*jupyter.Message)) (undo func())
	// Process returns the kernel's connected process, or, while it is
	// still being adopted, a channel closed once the adoption settled;
	// neither when the kernel is gone.
	Process() (p Process, adopting <-chan struct{})
	// Adopted returns the process an adoption connected, or how the
	// kernel ended without one.
	Adopted() (p Process, endedBy string)
	Interrupt(ctx context.Context) error
	// LateWait is how long the process's output may follow its idle
	// status (0: it never does).
	LateWait() time.Duration
}

// Process is a followed kernel's connected process.
type Process interface {
	// Barrier sends a kernel_info_request behind the run, done once both
	// its reply and its idle status came.
	Barrier() (Call, error)
	Forget(c Call)
	// Done is closed when the process ended; Err then says why.
	Done() <-chan struct{}
	Err() error
}

// PickUp makes r, which an earlier gateway started on the queue's kernel
// k, the queue's running run: a worker follows it to its end, then runs
// what was queued meanwhile.
func (q *Queue) PickUp(r *Run, k Followed) {
	q.mu.Lock()
	q.working, q.running = true, r
	q.mu.Unlock()
	q.cfg.Go(func() {
		q.follow(r, k)
		q.mu.Lock()
		q.running = nil
		q.mu.Unlock()
		q.runQueue(false)
	})
}

// follow follows r, which k still runs (or ran while no gateway was
// there), until it ends. The kernel's reply went to the earlier gateway's
// connection; the run ends when its status turns idle, or when a
// kernel_info request sent behind it on the shell channel is done, reply
// and idle status (the shell runs requests in order, iopub keeps their
// order): whichever comes first. A kernel still being adopted is waited
// for: its messages reach the run meanwhile; one that is lost loses the
// run.
func (q *Queue) follow(r *Run, k Followed) {
	r.Output("stderr", LostOutputMarker)
	r.mu.Lock()
	msgID := r.msgID
	r.mu.Unlock()

	idle := make(chan struct{})
	var idleOnce sync.Once
	late := NewLateOutput()
	undo := k.Route(msgID, func(m *jupyter.Message) {
		r.Handle(m, jupyter.IOPub)
		if m.ExecutionState() == jupyter.StateIdle {
			idleOnce.Do(func() { close(idle) })
		}
		late.Note(m)
	})
	defer undo()

	stop := make(chan Reason, 1)
	r.mu.Lock()
	r.cancel = func(reason Reason) {
		select {
		case stop <- reason:
		default:
		}
	}
	r.mu.Unlock()
	r.ArmDeadline(r.Expire)

	var barrier Call
	var barrierDone, pDone <-chan struct{}
	var p Process
	watch := func(next Process) {
		p, pDone = next, next.Done()
		// Its idle status too: iopub is ordered, so the run's messages
		// have all come once it has, whereas the reply, on another
		// socket, may come first (Deno's does).
		if c, err := p.Barrier(); err == nil && c != nil {
			barrier, barrierDone = c, c.Done()
		}
	}
	defer func() {
		if barrier != nil {
			p.Forget(barrier)
		}
	}()
	cur, adopting := k.Process()
	if cur != nil {
		watch(cur)
	} else if adopting == nil {
		q.Lose(r, "the gateway restarted during the run and its kernel was lost; the next run starts a new kernel without the earlier state")
		return
	}
	var grace <-chan time.Time
	var idleCh <-chan struct{} = idle
	for {
		select {
		case <-adopting:
			adopting = nil
			next, endedBy := k.Adopted()
			if next == nil {
				if endedBy == "" {
					endedBy = "was restarted or shut down"
				}
				q.Lose(r, "the gateway restarted during the run and its kernel "+endedBy+"; the next run starts a new kernel without the earlier state")
				return
			}
			watch(next)
			continue
		case <-idleCh:
			if barrierDone != nil {
				// The barrier follows at once, and its status comes
				// after what the run published late (Deno may publish
				// its result after its idle status).
				idleCh = nil
				continue
			}
		case <-barrierDone:
			// A kernel that answered it without its idle status (lost)
			// has run it, behind the run, all the same.
			if _, err := barrier.Result(); err != nil && !errors.Is(err, jupyter.ErrRequestDropped) {
				q.Lose(r, LostMessage(err))
				return
			}
		case <-pDone:
			q.Lose(r, LostMessage(p.Err()))
			return
		case why := <-stop:
			r.stopping(why)
			ictx, cancel := context.WithTimeout(context.Background(), q.cfg.InterruptGrace)
			k.Interrupt(ictx)
			cancel()
			if grace == nil {
				grace = time.After(q.cfg.InterruptGrace)
			}
			continue
		case <-grace:
			// The kernel did not stop, as in execute: restart it; the
			// run's state is lost.
			q.restartAfterInterrupt(r)
			q.Lose(r, "the kernel did not stop after an interrupt and was restarted; its state is gone")
			return
		}
		break
	}
	late.Settle(k.LateWait())
	r.Finish(r.followedReason(), nil)
}

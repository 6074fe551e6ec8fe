package sessions

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"kernelgate/jupyter"
	"kernelgate/runs"
	"kernelgate/state"
)

// This file is a replica's handover of its kernels when it stops while
// other replicas serve (docs/replicas.md): each kernel's runs finish
// here, then its lease goes to a live replica, which adopts it at once,
// and this replica lets it go without stopping it. A request for a
// kernel being handed over waits until it is over and is then sent on
// to the new owner (MovedError); one for a kernel whose lease is free,
// or was handed to this replica, takes it over here (AdoptKernel).

// handing is the manager's part of handovers.
type handing struct {
	// leaving: this replica hands its kernels over and takes none.
	leaving atomic.Bool
	// takeMu makes takeovers (AdoptKernel, the failover scan) one at a
	// time, so that a kernel is taken once.
	takeMu sync.Mutex

	mu sync.Mutex
	// moved are the handovers by "kernel:<id>" and "context:<id>", kept
	// once over: a request that found the kernel or context here just
	// before it went is sent on to its new owner.
	moved map[string]*handover
}

// handover is one kernel's.
type handover struct {
	kernel string
	done   chan struct{} // closed once the kernel is let go
	to     string        // the new owner's URL; "" when none took it
}

// MovedError says that a kernel, or a context of it, was handed over to
// another replica (or is being handed over). Its request is to be sent
// to the new owner (NewOwner), which takes it over if it has not yet.
// Unsent, it reads as ErrShuttingDown.
type MovedError struct {
	// What names what the request addressed ("context agent").
	What string
	h    *handover
}

func (e *MovedError) Error() string {
	return e.What + " is being handed over to another replica as this one stops"
}

// Unwrap makes an unsent MovedError an ErrShuttingDown.
func (e *MovedError) Unwrap() error { return ErrShuttingDown }

// NewOwner waits until the handover is over and returns the advertised
// URL of the replica that owns the kernel now. ErrShuttingDown when no
// replica took it (its lease was released: any replica asked for it
// takes it over).
func (e *MovedError) NewOwner(ctx context.Context) (string, error) {
	select {
	case <-e.h.done:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	if e.h.to == "" {
		return "", errorf(ErrShuttingDown, "%s was released for any replica to take over: retry", e.What)
	}
	return e.h.to, nil
}

// movedLocked returns the handover of key ("kernel:<id>",
// "context:<id>"), or nil. The caller holds handing.mu.
func (h *handing) movedLocked(key string) *handover { return h.moved[key] }

// movedError returns a MovedError for what is named key, when that was
// (or is being) handed over.
func (m *Manager) movedError(key, what string) error {
	m.handing.mu.Lock()
	h := m.handing.movedLocked(key)
	m.handing.mu.Unlock()
	if h == nil {
		return nil
	}
	return &MovedError{What: what, h: h}
}

// holdForHandover returns err, after waiting, when it is a MovedError,
// until the handover is over.
func holdForHandover(ctx context.Context, err error) error {
	var me *MovedError
	if !errors.As(err, &me) {
		return err
	}
	select {
	case <-me.h.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return err
}

// Leaving reports whether this replica is handing its kernels over (it
// is not ready for new requests).
func (m *Manager) Leaving() bool { return m.handing.leaving.Load() }

// HandoverReport says what a HandOver did.
type HandoverReport struct {
	// Peers is how many live replicas could take kernels.
	Peers int
	// Handed are the kernels handed over; Kept those left to stop with
	// this replica (shared and isolated contexts' kernels, and those no
	// replica took).
	Handed, Kept int
	// Unfinished are the runs still running when the drain ended (their
	// new owner follows them), and those still queued whose ids were
	// handed out (they never run).
	Unfinished int
}

// HandOver hands this replica's kernels over to the other live replicas
// as it stops: from now on it takes no kernel over (Leaving). Each
// kernel's runs finish here within drain (new runs for it wait), then
// its lease goes to a live replica, spread over them, this replica lets
// it go without stopping it, the requests that waited are sent on
// (MovedError), and tell asks the new owner to take it over at once
// (it would on the first request for it anyway, or when the lease
// lapses). Kernels of shared contexts (code-python, …) and isolated runs
// stay, to stop with the replica. With no other live replica it does
// nothing but mark the replica leaving: the last one standing shuts down
// as a single gateway does. It may be called again (the kernels started
// since are handed over then).
func (m *Manager) HandOver(ctx context.Context, drain time.Duration, tell func(ctx context.Context, url, kernel string) error) HandoverReport {
	var rep HandoverReport
	o := m.cfg.Ownership
	if o == nil {
		return rep
	}
	m.handing.leaving.Store(true)
	// Marked leaving in the store, no replica hands this one a kernel
	// from now on (one that stops at the same moment picks another),
	// and a lease handed to it just before is not adopted here: its
	// giver passes it on.
	pctx, cancel := context.WithTimeout(ctx, ownTimeout)
	if err := o.MarkLeaving(pctx); err != nil {
		m.log.Warn("cluster: this replica could not be marked leaving: a replica stopping at the same moment may hand it kernels, which it refuses for their giver to pass on", "err", err)
	}
	cancel()
	// A takeover begun before the mark ends before the kernels are
	// counted: what it took is handed over too.
	m.handing.takeMu.Lock()
	m.handing.takeMu.Unlock()
	pctx, cancel = context.WithTimeout(ctx, ownTimeout)
	peers, err := o.Peers(pctx)
	cancel()
	if err != nil {
		m.log.Warn("cluster: the live replicas could not be read: the kernels stay, to stop with this replica", "err", err)
	}
	rep.Peers = len(peers)
	if len(peers) == 0 {
		return rep
	}
	type move struct {
		k    *Kernel
		ctxs []*Context
		h    *handover
	}
	var moves []move
	for _, k := range m.Kernels() {
		if _, ok := o.Fence(k.id); !ok {
			continue // not leased here, or lost already
		}
		k.mu.Lock()
		starting := k.state == jupyter.StateStarting && k.adopting == nil
		k.mu.Unlock()
		if starting {
			continue // its start is a request in flight: the next call's
		}
		ctxs, ok := m.contextsOf(k)
		if !ok || len(ctxs) == 0 && k.policy == restartLazily {
			// A shared or isolated context's kernel, or a context's
			// kernel whose context is gone: it stops here.
			rep.Kept++
			continue
		}
		moves = append(moves, move{k, ctxs, &handover{kernel: k.id, done: make(chan struct{})}})
	}
	m.handing.mu.Lock()
	if m.handing.moved == nil {
		m.handing.moved = map[string]*handover{}
	}
	fresh := moves[:0]
	for _, mv := range moves {
		if m.handing.moved["kernel:"+mv.k.id] != nil {
			continue // handed over already (an earlier call)
		}
		m.handing.moved["kernel:"+mv.k.id] = mv.h
		for _, c := range mv.ctxs {
			m.handing.moved["context:"+c.ID] = mv.h
		}
		fresh = append(fresh, mv)
	}
	m.handing.mu.Unlock()
	moves = fresh
	// From here the contexts' queues take no new run (its request
	// waits, then goes to the new owner): their drains end.
	for _, mv := range moves {
		for _, c := range mv.ctxs {
			c.runs.Divert(&MovedError{What: "context " + c.ID, h: mv.h})
		}
	}

	deadline := time.Now().Add(drain)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, mv := range moves {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Spread over the peers, the first one tried in turn.
			first := i % len(peers)
			order := append(append([]state.Replica{}, peers[first:]...), peers[:first]...)
			unfinished, handed := m.handOverKernel(ctx, mv.k, mv.ctxs, mv.h, order, deadline, tell)
			mu.Lock()
			defer mu.Unlock()
			rep.Unfinished += unfinished
			if handed {
				rep.Handed++
			} else {
				rep.Kept++
			}
		}()
	}
	wg.Wait()
	return rep
}

// contextsOf lists k's contexts; false when k stays with this replica
// (a shared or isolated context's kernel).
func (m *Manager) contextsOf(k *Kernel) ([]*Context, bool) {
	m.mu.Lock()
	all := make([]*Context, 0, len(m.contexts))
	for _, c := range m.contexts {
		all = append(all, c)
	}
	m.mu.Unlock()
	var out []*Context
	for _, c := range all {
		c.mu.Lock()
		mine := c.kernel == k
		c.mu.Unlock()
		if !mine {
			continue
		}
		// A shared context (code-python, …) is the cluster's, claimed
		// in the store with its kernel's lease: it moves with it.
		if c.Isolated || c.Shared && m.claimer() == nil {
			return nil, false
		}
		out = append(out, c)
	}
	return out, true
}

// handedOverDuring is how a run still running when its kernel was handed
// over ends here.
const handedOverDuring = "this replica stopped during the run and handed the context's kernel over to another replica, which follows the run: its result is at GET /api/runs/{id}"

// handedOverBefore is how a run still queued, its id handed out, ends
// here when its kernel is handed over (the new owner's record says it
// never ran).
const handedOverBefore = "this replica stopped before the run started and handed the context's kernel over to another replica; the run never ran"

// handOverKernel drains k's contexts' queues until deadline, gives its
// lease to the first of peers that takes it, lets it go and ends h; then
// tells the new owner. It returns how many runs were left running, and
// whether a peer took the kernel (if none did, it stays here, to stop
// with this replica).
func (m *Manager) handOverKernel(ctx context.Context, k *Kernel, ctxs []*Context, h *handover, peers []state.Replica, deadline time.Time, tell func(ctx context.Context, url, kernel string) error) (unfinished int, handed bool) {
	o := m.cfg.Ownership
	for _, c := range ctxs {
		drainQueue(c.runs, deadline)
	}
	// The runs that never started and whose callers wait for them are
	// sent on with their requests. Those whose ids were handed out
	// (streamed, or in the background) stay recorded as queued: the new
	// owner says they never ran.
	for _, c := range ctxs {
		queued, running := c.runs.Take()
		for _, r := range queued {
			if r.Waited() {
				m.runs.Drop(r, &MovedError{What: "context " + c.ID, h: h})
			} else {
				unfinished++
				m.runs.Forget([]*runs.Run{r})
				r.Lose(handedOverBefore)
			}
		}
		if running != nil {
			unfinished++
		}
	}
	var lease state.Lease // the lease as handed
	next := 0             // the next of peers to try
	for ; next < len(peers) && h.to == ""; next++ {
		p := peers[next]
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ownTimeout)
		l, err := o.Handover(tctx, k.id, p.ID)
		cancel()
		if err == nil {
			lease, h.to = l, p.URL
			continue
		}
		if errors.Is(err, state.ErrFenced) || errors.Is(err, state.ErrNoLease) {
			m.log.Warn("kernel lease lost before its handover: the replica that holds it now has it", "kernel", k.id, "err", err)
			break
		}
		m.log.Warn("kernel not handed over to a replica: trying the next", "kernel", k.id, "to", p.URL, "err", err)
	}
	if h.to == "" {
		// No replica took it (they all stopped meanwhile): it stays,
		// to stop with this one as the last replica standing, its
		// contexts taking runs again until then (those asked for
		// meanwhile are refused: it is shutting down).
		for _, c := range ctxs {
			c.runs.Divert(nil)
		}
		m.handing.mu.Lock()
		for key, kh := range m.handing.moved {
			if kh == h {
				delete(m.handing.moved, key)
			}
		}
		m.handing.mu.Unlock()
		close(h.done)
		m.log.Warn("kernel not handed over: no other replica took it; it stops with this replica", "kernel", k.id)
		return unfinished, false
	}
	// The lease is the new owner's: nothing here acts for the kernel
	// again, and the new owner takes it over once this replica lets it go
	// (or, asked first, at once: this replica no longer writes for it).
	m.letGo(k, handedOverDuring, "this replica stopped during the command and handed the context's kernel over to another replica")
	if tell != nil {
		m.tellNewOwner(ctx, k.id, h, lease, peers[next:], tell)
	}
	// The requests that waited go to the owner told (or, when none
	// answered, to the last one handed the lease).
	close(h.done)
	m.log.Info("kernel handed over", "kernel", k.id, "to", h.to, "contexts", len(ctxs), "unfinished_runs", unfinished)
	return unfinished, true
}

// tellNewOwner asks the replica the lease was handed to (h.to) to take
// the kernel over now. One that refuses (it began leaving as the lease
// reached it: it adopts nothing) or does not answer has the lease passed
// on to the next of peers, which is asked in turn, until one takes it
// over or adopted it meanwhile (the lease is no longer handed), or no
// peer is left: the lease then lapses and the failover scan takes the
// kernel.
func (m *Manager) tellNewOwner(ctx context.Context, kernel string, h *handover, lease state.Lease, peers []state.Replica, tell func(ctx context.Context, url, kernel string) error) {
	o := m.cfg.Ownership
	for {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ownTimeout)
		err := tell(tctx, h.to, kernel)
		cancel()
		if err == nil {
			return
		}
		passed := false
		for len(peers) > 0 && !passed {
			p := peers[0]
			peers = peers[1:]
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ownTimeout)
			l, perr := o.PassOn(tctx, lease, p.ID)
			cancel()
			switch {
			case perr == nil:
				m.log.Info("the replica handed a kernel did not take it over: its lease passed on to the next", "kernel", kernel, "from", h.to, "to", p.URL, "err", err)
				lease, h.to, passed = l, p.URL, true
			case errors.Is(perr, state.ErrNotHanded):
				m.log.Info("the new owner was not told of its kernel, and took it meanwhile", "kernel", kernel, "to", h.to, "err", err)
				return
			default:
				m.log.Warn("a kernel's lease not passed on to a replica: trying the next", "kernel", kernel, "to", p.URL, "err", perr)
			}
		}
		if !passed {
			m.log.Info("the new owner was not told of its kernel: it takes it over on the first request for it, or its lease lapses and the failover scan takes it", "kernel", kernel, "to", h.to, "err", err)
			return
		}
	}
}

// drainPoll is how often a drain looks again at a queue between two runs.
const drainPoll = 20 * time.Millisecond

// drainQueue waits until q has no run running nor waiting, or deadline.
func drainQueue(q *runs.Queue, deadline time.Time) {
	for {
		running := q.Running()
		if running == nil && q.Len() == 0 {
			return
		}
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		var wake <-chan struct{}
		wait := min(left, drainPoll)
		if running != nil {
			wake, wait = running.Done(), left
		}
		t := time.NewTimer(wait)
		select {
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// AdoptKernel takes over here the kernel of id whose lease was handed
// to this replica, or is free (released, or lapsed), with its contexts,
// Jupyter sessions and runs, as the failover scan does, at once: for a
// request that names it. Nothing when this replica has it already (or
// is handing it over); state.ErrLeaseHeld when another replica holds it;
// ErrShuttingDown when this replica is leaving: a kernel handed to it
// then is refused, and its giver passes the lease on (HandOver).
func (m *Manager) AdoptKernel(ctx context.Context, id string) error {
	o := m.cfg.Ownership
	if o == nil {
		return nil
	}
	var moved *MovedError
	if _, err := m.Kernel(id); err == nil || errors.As(err, &moved) {
		return nil // here, or being handed over from here
	}
	if m.handing.leaving.Load() {
		return errorf(ErrShuttingDown, "this replica is handing its kernels over: it takes none over")
	}
	m.handing.takeMu.Lock()
	defer m.handing.takeMu.Unlock()
	if _, err := m.Kernel(id); err == nil {
		return nil
	}
	if m.handing.leaving.Load() {
		return errorf(ErrShuttingDown, "this replica is handing its kernels over: it takes none over")
	}
	if m.elsewhere.has(id) {
		// A local kernel of another host, left to its replicas
		// (elsewhere.go): asked for here, it stays theirs.
		return errorf(ErrNoSuchKernel, "kernel %s runs on another host, left to the replicas there", id)
	}
	if _, err := o.Adopt(ctx, id); err != nil {
		if _, err := o.Acquire(ctx, id); err != nil {
			return err
		}
	}
	rep, took := m.takeOver(ctx, map[string]bool{id: true})
	if !took {
		return errorf(ErrShuttingDown, "kernel %s: its records could not be read", id)
	}
	if rep.Adopted+rep.Pending+rep.Lost == 0 {
		// No record of it (shut down meanwhile): nothing to keep.
		m.disown(ctx, id)
		return nil
	}
	m.log.Info("cluster: took a kernel over on request", "kernel", id, "adopted", rep.Adopted, "pending", rep.Pending, "lost", rep.Lost,
		"contexts", rep.Contexts, "sessions", rep.Sessions, "runs", rep.Runs, "picked_up", rep.PickedUp)
	return nil
}

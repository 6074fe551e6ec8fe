package sessions

import (
	"context"
	"sort"
	"sync"
	"time"

	"kernelgate/kernelspecs"
)

// pool keeps kernels of one kernelspec started and ready for isolated
// runs and new contexts (warm.go). A kernel leaves the pool for one user
// and is never given back; the pool refills in the background, within the
// places MaxKernels leaves free (see slots.go): a user's kernel that needs
// the place of a pooled one has it stopped.
//
// The pool sizes itself to the rate of takes: it keeps as many kernels as
// were taken in the last rateWindow, no fewer than floor (PoolSize) and no
// more than ceiling (PoolMax). Above its floor it holds one timer, which
// stops the kernels above the floor once no kernel was taken for idle
// (PoolIdle); at its floor it holds none, and an idle pool wakes nothing.
type pool struct {
	m              *Manager
	spec           *kernelspecs.Spec
	floor, ceiling int
	idle           time.Duration

	mu       sync.Mutex
	ready    []*Kernel
	starting int
	starts   []*poolStart // the starts in flight
	hits     int
	misses   int
	takes    []time.Time // the recent takes, oldest first (at most ceiling)
	lastTake time.Time
	shrink   *time.Timer // armed only while the pool holds more than floor
}

// rateWindow is how far back the takes that size the pool are counted: a
// kernel taken is replaced within about a second (the time a start takes,
// or refillDelay), so the takes of the last two cover a steady rate with
// room to spare.
const rateWindow = 2 * time.Second

// targetLocked is how many kernels the pool keeps now; p.mu is held.
func (p *pool) targetLocked(now time.Time) int {
	n := 0
	for _, t := range p.takes {
		if now.Sub(t) < rateWindow {
			n++
		}
	}
	return min(p.ceiling, max(p.floor, n))
}

// noteTakeLocked records a take (hit or miss: both are demand); p.mu is held.
func (p *pool) noteTakeLocked(now time.Time) {
	p.lastTake = now
	p.takes = append(p.takes, now)
	for len(p.takes) > 0 && (len(p.takes) > p.ceiling || now.Sub(p.takes[0]) >= rateWindow) {
		p.takes = p.takes[1:]
	}
}

// armShrinkLocked arms the shrink timer when the pool holds more than its
// floor and none is armed; p.mu is held.
func (p *pool) armShrinkLocked(now time.Time) {
	if p.shrink != nil || len(p.ready)+p.starting <= p.floor {
		return
	}
	wait := p.lastTake.Add(p.idle).Sub(now)
	if wait <= 0 {
		wait = p.idle
	}
	p.shrink = time.AfterFunc(wait, p.shrinkIdle)
}

// shrinkIdle stops the ready kernels above the floor once no kernel was
// taken for p.idle; before that, or while kernels above the floor are
// still starting, it arms itself again.
func (p *pool) shrinkIdle() {
	now := time.Now()
	p.mu.Lock()
	p.shrink = nil
	select {
	case <-p.m.closing:
		p.mu.Unlock()
		return
	default:
	}
	var extra []*Kernel
	if now.Sub(p.lastTake) >= p.idle {
		for len(p.ready) > 0 && len(p.ready)+p.starting > p.floor {
			n := len(p.ready)
			extra = append(extra, p.ready[n-1])
			p.ready = p.ready[:n-1]
		}
	}
	p.armShrinkLocked(now) // starts in flight above the floor: look again later
	p.mu.Unlock()
	if len(extra) > 0 {
		p.m.log.Info("warm pool: idle kernels above --pool-size stopped", "spec", p.spec.Name, "stopped", len(extra))
	}
	for _, k := range extra {
		p.discard(k)
	}
}

// poolStart is a pool kernel being started.
type poolStart struct {
	cancel  context.CancelFunc
	evicted bool // stopped to make room: its place is already a stopping one
}

// refillDelay is how long the pool waits after handing out a kernel
// before it starts the replacement, unless the run that took the kernel
// ends sooner (its context refills then): a starting kernel takes a core
// for most of a second, which on a small machine slows the very run the
// pool is serving.
const refillDelay = time.Second

// take returns a ready kernel, moved with its place under MaxKernels to
// the manager's kernels, or nil. After a miss the pool refills at once;
// after a hit too while takes come faster than one a window and the pool
// runs low, else when the run ends or refillDelay has passed. The kernel
// is no longer the pool's: nothing else can take it.
func (p *pool) take() *Kernel {
	now := time.Now()
	p.mu.Lock()
	p.noteTakeLocked(now)
	var k *Kernel
	var dead []*Kernel
	for len(p.ready) > 0 && k == nil {
		k = p.ready[0]
		p.ready = p.ready[1:]
		if !k.Running() || !p.m.adoptPooled(k) { // died while it waited, or the manager closes
			dead = append(dead, k)
			k = nil
		}
	}
	if k != nil {
		p.hits++
	} else {
		p.misses++
	}
	target := p.targetLocked(now)
	burst := len(p.takes) > 1 && 2*len(p.ready) < target
	p.mu.Unlock()
	for _, d := range dead {
		p.discard(d)
	}
	p.m.cfg.Observer.PoolTaken(p.spec.Name, k != nil)
	if k == nil || burst {
		p.refill()
	} else {
		time.AfterFunc(refillDelay, p.refill)
	}
	return k
}

// discard stops a kernel taken out of the pool; its place is free once
// its process is gone.
func (p *pool) discard(k *Kernel) {
	p.m.pooledStopping()
	p.m.goroutine(func() { p.stop(context.Background(), k) })
}

// stop shuts down a kernel of the pool whose place is marked as being
// stopped, deletes its workspace and frees its place.
func (p *pool) stop(ctx context.Context, k *Kernel) {
	k.shutdown(ctx)
	k.ws.Delete()
	p.m.stopped()
	// Among replicas a pool kernel holds a lease from its start
	// (newKernel), counted by the others under --max-kernels: given up
	// with its process.
	p.m.disown(ctx, k.id)
}

// refill starts kernels until the pool holds its target, or no place is
// free.
func (p *pool) refill() {
	// The other replicas' kernels, asked before p.mu is taken; when the
	// store cannot say, the pool waits for its next refill.
	peers, err := p.m.peerKernels(p.m.closingCtx)
	if err != nil {
		p.m.log.Warn("warm pool not refilled", "spec", p.spec.Name, "err", err)
		return
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.armShrinkLocked(now)
	for len(p.ready)+p.starting < p.targetLocked(now) {
		select {
		case <-p.m.closing:
			return
		default:
		}
		if !p.m.claimPooled(peers) {
			return
		}
		// A start still going when the manager closes, or evicted to
		// make room, is abandoned.
		ctx, cancel := context.WithCancel(p.m.closingCtx)
		st := &poolStart{cancel: cancel}
		p.starting++
		p.starts = append(p.starts, st)
		p.m.goroutine(func() { p.startOne(ctx, st) })
	}
}

// evict stops a ready kernel (ready) or a start in flight (!ready) of the
// pool to make room for a user's kernel; false when there is none.
func (p *pool) evict(ready bool) bool {
	p.mu.Lock()
	if ready {
		n := len(p.ready)
		if n == 0 {
			p.mu.Unlock()
			return false
		}
		k := p.ready[n-1]
		p.ready = p.ready[:n-1]
		p.mu.Unlock()
		p.m.log.Info("warm pool: a ready kernel stopped to make room under --max-kernels", "spec", p.spec.Name)
		p.discard(k)
		return true
	}
	defer p.mu.Unlock()
	for _, st := range p.starts {
		if !st.evicted {
			st.evicted = true
			p.m.pooledStopping()
			st.cancel()
			p.m.log.Info("warm pool: a starting kernel stopped to make room under --max-kernels", "spec", p.spec.Name)
			return true
		}
	}
	return false
}

func (p *pool) startOne(ctx context.Context, st *poolStart) {
	defer st.cancel()
	id := newID()
	ws, err := p.m.newWorkspace(runWorkspace(id), p.spec)
	var k *Kernel
	if err == nil {
		if k, err = p.m.newKernel(id, p.spec, nil, workDir{ws: ws, cwd: ws.Dir()}, restartLazily); err != nil {
			ws.Delete()
		}
	}
	if err == nil {
		k.life.Lock()
		err = k.launch(ctx)
		k.life.Unlock()
	}
	p.mu.Lock()
	p.starting--
	for i, s := range p.starts {
		if s == st {
			p.starts = append(p.starts[:i], p.starts[i+1:]...)
			break
		}
	}
	evicted := st.evicted
	closed := false
	select {
	case <-p.m.closing:
		closed = true
	default:
	}
	if err == nil && !closed && !evicted {
		p.ready = append(p.ready, k)
		p.mu.Unlock()
		return
	}
	if !evicted {
		p.m.pooledStopping()
	}
	p.mu.Unlock()
	if err != nil && !closed && !evicted {
		p.m.log.Warn("warm pool: kernel failed to start", "spec", p.spec.Name, "err", err)
	}
	if k != nil {
		k.shutdown(context.Background())
		ws.Delete()
	}
	p.m.stopped()
	if k != nil {
		p.m.disown(context.Background(), id)
	}
}

// PoolStats says how the pool of a kernelspec is doing.
type PoolStats struct {
	Spec     string `json:"spec"`
	Ready    int    `json:"ready"`
	Starting int    `json:"starting"`
	// Target is how many kernels the pool keeps now, between its floor
	// and its ceiling, by the rate of takes.
	Target int `json:"target"`
	Hits   int `json:"hits"`
	Misses int `json:"misses"`
}

func (p *pool) stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PoolStats{Spec: p.spec.Name, Ready: len(p.ready), Starting: p.starting, Target: p.targetLocked(time.Now()), Hits: p.hits, Misses: p.misses}
}

// drain shuts down the ready kernels.
func (p *pool) drain(ctx context.Context) {
	p.mu.Lock()
	ready := p.ready
	p.ready = nil
	if p.shrink != nil {
		p.shrink.Stop()
		p.shrink = nil
	}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, k := range ready {
		p.m.pooledStopping()
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.stop(ctx, k)
		}()
	}
	wg.Wait()
}

// WarmPools are the warm pools, one per kernelspec: kernels started ahead
// for isolated runs and new contexts.
type WarmPools struct {
	m *Manager

	mu     sync.Mutex
	bySpec map[string]*pool
	closed bool
}

// WarmPools are the manager's warm pools.
func (m *Manager) WarmPools() *WarmPools { return m.warm }

// get returns the warm pool of a kernelspec, or nil when pools are off.
func (w *WarmPools) get(spec *kernelspecs.Spec) *pool {
	cfg := &w.m.cfg
	if cfg.PoolSize <= 0 {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	p, ok := w.bySpec[spec.Name]
	if !ok {
		p = &pool{m: w.m, spec: spec, floor: cfg.PoolSize, ceiling: cfg.PoolMax, idle: cfg.PoolIdle}
		w.bySpec[spec.Name] = p
	}
	return p
}

// all returns the pools.
func (w *WarmPools) all() []*pool {
	w.mu.Lock()
	defer w.mu.Unlock()
	ps := make([]*pool, 0, len(w.bySpec))
	for _, p := range w.bySpec {
		ps = append(ps, p)
	}
	return ps
}

// close makes no more pools and returns those there are, to drain.
func (w *WarmPools) close() []*pool {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	return w.all()
}

// Prewarm fills the warm pools of the given languages now.
func (w *WarmPools) Prewarm(languages []string) error {
	for _, lang := range languages {
		spec, err := w.m.catalog.languageSpec(lang)
		if err != nil {
			return err
		}
		if p := w.get(spec); p != nil {
			p.refill()
		}
	}
	return nil
}

// Stats reports the warm pools.
func (w *WarmPools) Stats() []PoolStats {
	ps := w.all()
	out := make([]PoolStats, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.stats())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Spec < out[j].Spec })
	return out
}

// evict stops one pooled kernel (a ready one first, else one still
// starting) to make room for a user's; false when the pools hold none.
func (w *WarmPools) evict() bool {
	ps := w.all()
	for _, ready := range []bool{true, false} {
		for _, p := range ps {
			if p.evict(ready) {
				return true
			}
		}
	}
	return false
}

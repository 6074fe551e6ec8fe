package sessions

import (
	"context"
	"sync"
	"time"

	"kernelgate/kernelspecs"
)

// pool keeps kernels of one kernelspec started and ready for isolated
// runs. A kernel leaves the pool for one run and is never given back; the
// pool refills in the background.
type pool struct {
	m    *Manager
	spec *kernelspecs.Spec
	size int

	mu       sync.Mutex
	ready    []*Kernel
	starting int
	hits     int
	misses   int
}

// refillDelay is how long the pool waits after handing out a kernel
// before it starts the replacement, unless the run that took the kernel
// ends sooner (its context refills then): a starting kernel takes a core
// for most of a second, which on a small machine slows the very run the
// pool is serving.
const refillDelay = time.Second

// take returns a ready kernel, or nil. After a miss the pool refills at
// once; after a hit, when the run ends or refillDelay has passed.
func (p *pool) take() *Kernel {
	p.mu.Lock()
	var k *Kernel
	for len(p.ready) > 0 && k == nil {
		k = p.ready[0]
		p.ready = p.ready[1:]
		if !k.Running() { // died while it waited
			go func(k *Kernel) {
				k.shutdown(context.Background())
				k.ws.Delete()
			}(k)
			k = nil
		}
	}
	if k != nil {
		p.hits++
	} else {
		p.misses++
	}
	p.mu.Unlock()
	p.m.cfg.Observer.PoolTaken(p.spec.Name, k != nil)
	if k == nil {
		p.refill()
	} else {
		time.AfterFunc(refillDelay, p.refill)
	}
	return k
}

// refill starts kernels until the pool is full.
func (p *pool) refill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.ready)+p.starting < p.size {
		select {
		case <-p.m.closing:
			return
		default:
		}
		p.starting++
		p.m.goroutine(p.startOne)
	}
}

func (p *pool) startOne() {
	id := newID()
	ws, err := p.m.newWorkspace(runWorkspace(id), p.spec)
	var k *Kernel
	if err == nil {
		if k, err = p.m.newKernel(id, p.spec, nil, workDir{ws: ws, cwd: ws.Dir()}, restartLazily); err != nil {
			ws.Delete()
		}
	}
	if err != nil {
		p.mu.Lock()
		p.starting--
		p.mu.Unlock()
		p.m.log.Warn("warm pool: kernel not started", "spec", p.spec.Name, "err", err)
		return
	}
	// A start still going when the manager closes is abandoned.
	ctx, cancel := context.WithCancel(context.Background())
	go func() { // ends with cancel below at the latest
		select {
		case <-p.m.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	k.life.Lock()
	err = k.launch(ctx)
	k.life.Unlock()
	cancel()
	p.mu.Lock()
	p.starting--
	closed := false
	select {
	case <-p.m.closing:
		closed = true
	default:
	}
	if err == nil && !closed {
		p.ready = append(p.ready, k)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	if err != nil && !closed {
		p.m.log.Warn("warm pool: kernel failed to start", "spec", p.spec.Name, "err", err)
	}
	k.shutdown(context.Background())
	ws.Delete()
}

// PoolStats says how the pool of a kernelspec is doing.
type PoolStats struct {
	Spec     string `json:"spec"`
	Ready    int    `json:"ready"`
	Starting int    `json:"starting"`
	Hits     int    `json:"hits"`
	Misses   int    `json:"misses"`
}

func (p *pool) stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PoolStats{Spec: p.spec.Name, Ready: len(p.ready), Starting: p.starting, Hits: p.hits, Misses: p.misses}
}

// drain shuts down the ready kernels.
func (p *pool) drain(ctx context.Context) {
	p.mu.Lock()
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, k := range ready {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k.shutdown(ctx)
			k.ws.Delete()
		}()
	}
	wg.Wait()
}

//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"kernelgate/internal/directclient"
)

// execTimeout bounds one execute under load; past it the execute counts
// as an error.
const execTimeout = 30 * time.Second

// loadResult is one system's executes under load, over every round.
type loadResult struct {
	mu      sync.Mutex
	lat     sample
	errs    int
	missing int // executes that completed without their result
	total   int
	wall    time.Duration
	cpu     time.Duration
	self    time.Duration // this process's CPU: the clients'
	first   error         // the first error seen, for the log
}

// record adds the outcome of one execute.
func (r *loadResult) record(d time.Duration, missing bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.errs++
		if r.first == nil {
			r.first = err
		}
		return
	}
	r.lat = append(r.lat, d)
	if missing {
		r.missing++
	}
}

func (r *loadResult) rate() float64 { return float64(r.total) / r.wall.Seconds() }

// loadPhase is one system's share of a round: workers each running count
// executes one after the other.
type loadPhase struct {
	name    string
	res     *loadResult
	workers int
	count   int
	exec    func(ctx context.Context, worker int) (missing bool, err error)
	cpu     func() time.Duration
	// open and close, when set, run before and after the phase, outside
	// what is measured (the websocket phase's websockets are open only
	// during it).
	open  func(ctx context.Context) error
	close func()
}

// run runs the phase; measured phases add to their result.
// runLoadRounds warms each phase up (two executes per worker, not
// measured), then runs rounds of them all in turn, measured, and says
// which phases had errors; what names the section in the progress lines,
// unit what a phase counts.
func runLoadRounds(ctx context.Context, what, unit string, phases []loadPhase, rounds int) error {
	progress("%s: warming up", what)
	for _, p := range phases {
		p.count = 2 // p is a copy: the rounds keep their count
		if err := p.run(ctx, false); err != nil {
			return err
		}
	}
	for r := range rounds {
		for _, p := range phases {
			progress("%s: round %d/%d, %s, %d %s", what, r+1, rounds, p.name, p.workers*p.count, unit)
			if err := p.run(ctx, true); err != nil {
				return err
			}
		}
	}
	for _, p := range phases {
		if p.res.first != nil {
			progress("%s: %s: %d errors, the first: %v", what, p.name, p.res.errs, p.res.first)
		}
	}
	return nil
}

func (p loadPhase) run(ctx context.Context, measured bool) error {
	if p.open != nil {
		if err := p.open(ctx); err != nil {
			return err
		}
	}
	if p.close != nil {
		defer p.close()
	}
	res := p.res
	if !measured {
		res = &loadResult{}
	}
	cpu0, self0, t0 := p.cpu(), selfCPU(), time.Now()
	var wg sync.WaitGroup
	for w := range p.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range p.count {
				ectx, cancel := within(ctx, execTimeout)
				t := time.Now()
				missing, err := p.exec(ectx, w)
				res.record(time.Since(t), missing, err)
				cancel()
			}
		}()
	}
	wg.Wait()
	if measured {
		res.mu.Lock()
		res.wall += time.Since(t0)
		res.cpu += p.cpu() - cpu0
		res.self += selfCPU() - self0
		res.total += p.workers * p.count
		res.mu.Unlock()
	}
	return nil
}

// loadGateway is a kernelgate set up for the load test: one context per
// kernel; the websocket phase opens clients websockets on each context's
// kernel for its run and closes them after, so that the REST phase's
// iopub goes to no websocket.
type loadGateway struct {
	s         *server
	contexts  []string
	kernelIDs []string
	clients   int // per kernel
	ws        []*kernelWS
	rest      []*restConn
	// startFailures counts contexts whose kernel failed to start (then
	// retried) while the test was set up.
	startFailures int
}

func (b *bench) setupLoad(ctx context.Context, s *server, language string) (*loadGateway, error) {
	o := b.opt
	g := &loadGateway{s: s, contexts: make([]string, o.loadKernels), kernelIDs: make([]string, o.loadKernels), clients: o.loadClients}
	var mu sync.Mutex
	err := parallel(o.loadKernels, 4, func(i int) error {
		var err error
		for range 3 {
			if g.contexts[i], g.kernelIDs[i], err = s.createContext(ctx, language); err == nil {
				return nil
			}
			// A start can fail on a port another kernel took meanwhile:
			// count it and try again.
			progress("load: %s: a kernel did not start: %v", s.name, err)
			mu.Lock()
			g.startFailures++
			mu.Unlock()
		}
		return err
	})
	if err != nil {
		return g, err
	}
	// One keep-alive connection per REST client, written and read on the
	// caller's goroutine (as in the round-trip section).
	for range o.loadKernels * o.loadClients {
		c, err := newRESTConn(s)
		if err != nil {
			return g, err
		}
		g.rest = append(g.rest, c)
	}
	return g, nil
}

// openWS dials the websocket phase's clients.
func (g *loadGateway) openWS(ctx context.Context) error {
	for i := range len(g.kernelIDs) * g.clients {
		c, err := dialKernel(ctx, g.s, g.kernelIDs[i%len(g.kernelIDs)], true)
		if err != nil {
			return err
		}
		g.ws = append(g.ws, c)
		if err := c.kernelInfo(ctx); err != nil {
			return err
		}
	}
	return nil
}

// closeWS closes them and waits until the gateway has let them go.
func (g *loadGateway) closeWS() {
	for _, c := range g.ws {
		c.Close()
		<-c.closed
	}
	g.ws = nil
}

func (g *loadGateway) close() {
	g.closeWS()
	for _, c := range g.rest {
		c.Close()
	}
	for _, id := range g.contexts {
		if id != "" {
			g.s.deleteContext(context.Background(), id)
		}
	}
}

// phases returns the websocket and REST phases of the gateway.
func (g *loadGateway) phases(name string, count int) (ws, rest loadPhase) {
	cpu := func() time.Duration { d, _ := cpuTime(g.s.pid()); return d }
	workers := len(g.kernelIDs) * g.clients
	ws = loadPhase{name: name + " websocket", res: &loadResult{}, workers: workers, count: count, cpu: cpu,
		open: g.openWS, close: g.closeWS,
		exec: func(ctx context.Context, w int) (bool, error) {
			out, err := g.ws[w].execute(ctx, "1+1", 0)
			if err == nil && out.wrong("2") {
				err = fmt.Errorf("%w: status %s, result %q", errWrong, out.status, out.text)
			}
			return out.text == "", err
		}}
	bodies := make([][]byte, workers)
	for w := range bodies {
		bodies[w], _ = json.Marshal(map[string]any{"code": "1+1", "context": g.contexts[w%len(g.contexts)]})
	}
	rest = loadPhase{name: name + " POST /api/execute", res: &loadResult{}, workers: workers, count: count, cpu: cpu,
		exec: func(ctx context.Context, w int) (bool, error) {
			missing, err := g.rest[w].execute(ctx, bodies[w], "2")
			if err != nil {
				g.rest[w].Close() // a broken connection is dialled again
				g.rest[w].conn = nil
			}
			return missing, err
		}}
	return ws, rest
}

// benchLoad runs loadKernels Deno kernels with loadClients clients each,
// every client issuing loadCount executes of `1+1` one after the other,
// through kernelgate's v1 websocket and through POST /api/execute (each
// kernel a context), and the direct client with one client per kernel
// issuing as many executes. Rounds alternate the systems. CPU is the
// gateway process's for kernelgate and this process's (the direct
// clients') for direct.
func (b *bench) benchLoad(ctx context.Context) error {
	const specName, language = "deno", "javascript"
	spec, _ := b.specs.Get(specName)
	o := b.opt
	sctx, cancel := within(ctx, 10*time.Minute)
	defer cancel()

	progress("load: starting %d %s kernels for each system", o.loadKernels, specName)
	directs := make([]*directclient.Client, o.loadKernels)
	defer func() {
		for _, c := range directs {
			if c != nil {
				c.Close()
			}
		}
	}()
	if err := parallel(o.loadKernels, 4, func(i int) error {
		return b.retry(func() error {
			var err error
			directs[i], err = directclient.Start(sctx, spec)
			return err
		})
	}); err != nil {
		return err
	}
	// Each system's kernels start after the previous system's are up: a
	// port picked free by one launcher can be taken by a kernel another
	// launcher starts at the same moment.
	kg, err := b.setupLoad(sctx, b.kg, language)
	defer kg.close()
	if err != nil {
		return err
	}
	direct := loadPhase{name: "direct", res: &loadResult{}, workers: o.loadKernels, count: o.loadCount * o.loadClients, cpu: selfCPU,
		exec: func(ctx context.Context, w int) (bool, error) {
			status, err := directs[w].Execute(ctx, "1+1")
			if err == nil && status != "ok" {
				err = fmt.Errorf("%w: status %s", errWrong, status)
			}
			return false, err
		}}
	ws, rest := kg.phases("kernelgate", o.loadCount)
	phases := []loadPhase{direct, ws, rest}
	var wsB, restB loadPhase
	var kgB *loadGateway
	if b.kgB != nil {
		kgB, err = b.setupLoad(sctx, b.kgB, language)
		defer kgB.close()
		if err != nil {
			return err
		}
		wsB, restB = kgB.phases("kernelgate B", o.loadCount)
		phases = append(phases, wsB, restB)
	}
	if err := runLoadRounds(sctx, "load", "executes", phases, o.loadRounds); err != nil {
		return err
	}

	shape := fmt.Sprintf("%d %s kernels × %d clients", o.loadKernels, specName, o.loadClients)
	thr := func(r *loadResult) string {
		return fmt.Sprintf("%.0f executes/s, %d errors of %d", r.rate(), r.errs, r.total) + missingNote(r.missing)
	}
	p5099 := func(r *loadResult) string {
		return fmt.Sprintf("%s / %s ms", fmtMS(r.lat.p50()), fmtMS(r.lat.p99()))
	}
	perExec := func(r *loadResult) float64 { return r.cpu.Seconds() / float64(r.total) }
	d := direct.res
	report := func(label string, r *loadResult, a *loadResult, g *loadGateway) {
		fails := ""
		if g.startFailures > 0 {
			fails = fmt.Sprintf("; %d kernel starts failed while setting up (retried)", g.startFailures)
		}
		b.add(row{figure: fmt.Sprintf("Throughput, %s, %s (direct: %d kernels × 1 client)", shape, label, o.loadKernels),
			kg: thr(r) + fails, direct: thr(d), ratios: "kg/direct throughput " + ratio(r.rate(), d.rate())})
		b.add(row{figure: "Latency p50 / p99 under that load, " + label, kg: p5099(r), direct: p5099(d)})
		rs := "kg/direct " + ratio(perExec(r), perExec(d))
		if a != nil {
			rs += "; B/A " + ratio(perExec(r), perExec(a))
		}
		// The harness's clients share the cores with the kernels too.
		rs += fmt.Sprintf("; the harness's clients %.2f CPU s", r.self.Seconds()/float64(r.total)*1000)
		b.add(row{figure: "CPU per 1 000 executes, " + label + " (kernelgate: the gateway process; direct: the client process)",
			kg: fmt.Sprintf("%.2f CPU s", perExec(r)*1000), direct: fmt.Sprintf("%.2f CPU s", perExec(d)*1000), ratios: rs})
	}
	report("v1 websocket", ws.res, nil, kg)
	report("POST /api/execute", rest.res, nil, &loadGateway{})
	// Issue 17's goals, for kernelgate (A).
	b.check(fmt.Sprintf("%s, v1 websocket: ≥ 0.95× the direct clients' throughput", shape), ws.res.rate() >= 0.95*d.rate(),
		"%s", ratio(ws.res.rate(), d.rate()))
	b.check(fmt.Sprintf("%s, POST /api/execute: ≥ 0.95× the direct clients' throughput, ≤ 1.1× their CPU per execute", shape),
		rest.res.rate() >= 0.95*d.rate() && perExec(rest.res) <= 1.1*perExec(d),
		"throughput %s, CPU %s", ratio(rest.res.rate(), d.rate()), ratio(perExec(rest.res), perExec(d)))
	b.missedBecause("the 16 kernels are the bottleneck on this machine's 2 cores, and the gateway's CPU (HTTP, run records, Executions) and the harness's 64 HTTP clients come out of the same cores; the direct clients are one caller per kernel in the harness's process")
	if kgB != nil {
		report("v1 websocket, kernelgate B", wsB.res, ws.res, kgB)
		report("POST /api/execute, kernelgate B", restB.res, rest.res, &loadGateway{})
	}
	return nil
}

// parallel runs fn(0..n-1) with at most width at a time and returns the
// first error.
func parallel(n, width int, fn func(int) error) error {
	sem := make(chan struct{}, width)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs <- fn(i)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

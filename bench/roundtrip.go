//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"kernelgate/internal/directclient"
	"kernelgate/jupyter"
	"kernelgate/provision/local"
)

// benchRoundTrip measures `1+1` from sending the request until both its
// reply and its status: idle have arrived (for POST /api/execute: until
// the Execution is read), on one warm kernel per system, one request of
// each system in turn.
func (b *bench) benchRoundTrip(ctx context.Context) error {
	for _, k := range kernels {
		if err := b.roundTrip(ctx, k.spec, k.language); err != nil {
			return err
		}
	}
	return nil
}

// rtSystem is one way of running `1+1` in the round-trip section, on
// one or more kernels taken in turn.
type rtSystem struct {
	runs []func(context.Context) (outcome, error)
	next int
	lat  sample
	late int // round trips that ended without their result (it came after idle)
	// procs, when set, gives for each run the process its CPU time is
	// charged to (read around each round trip, outside the timing): the
	// gateway, or the relay of the floor; cpuOf names it.
	procs []func() int
	cpuOf string
	cpu   time.Duration
}

// cpuNote is the CPU time of the measured process per round trip.
func (s *rtSystem) cpuNote() string {
	if s.procs == nil || len(s.lat) == 0 {
		return ""
	}
	return fmt.Sprintf("; %s CPU %.0f µs per round trip", s.cpuOf, float64(s.cpu.Microseconds())/float64(len(s.lat)))
}

// cpuPer is the CPU time of the measured process per round trip.
func cpuPer(s *rtSystem) string {
	if len(s.lat) == 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f µs", float64(s.cpu.Microseconds())/float64(len(s.lat)))
}

// join makes one system of several, each on a kernel of its own: turn by
// turn, they average out how far one kernel process differs from another.
func join(systems ...*rtSystem) *rtSystem {
	j := &rtSystem{}
	for _, s := range systems {
		j.runs = append(j.runs, s.runs...)
		j.procs = append(j.procs, s.procs...)
		if s.cpuOf != "" {
			j.cpuOf = s.cpuOf
		}
	}
	return j
}

func (s *rtSystem) step(ctx context.Context) error {
	i := s.next % len(s.runs)
	run := s.runs[i]
	s.next++
	pid := 0
	if s.procs != nil {
		pid = s.procs[i]()
	}
	var cpu0 time.Duration
	if pid != 0 {
		cpu0, _ = cpuTime(pid)
	}
	t0 := time.Now()
	o, err := run(ctx)
	d := time.Since(t0)
	if err != nil {
		return err
	}
	if pid != 0 {
		cpu1, _ := cpuTime(pid)
		s.cpu += cpu1 - cpu0
	}
	if o.wrong("2") {
		return fmt.Errorf("%w: status %s, result %q", errWrong, o.status, o.text)
	}
	if o.text == "" {
		s.late++
	}
	s.lat = append(s.lat, d)
	return nil
}

// kernelClientSystem runs `1+1` through kernelgate's own kernel client
// (package jupyter) in the harness's process: the gateway's kernel side
// without the process hop.
func kernelClientSystem(k *jupyter.Kernel) *rtSystem {
	return &rtSystem{runs: []func(context.Context) (outcome, error){func(ctx context.Context) (outcome, error) {
		reply, err := k.Execute(ctx, "1+1", nil)
		if err != nil {
			return outcome{}, err
		}
		var c struct {
			Status string `json:"status"`
		}
		if err := reply.DecodeContent(&c); err != nil {
			return outcome{}, err
		}
		return outcome{status: c.Status, text: "2"}, nil // like the direct client, it reads no result
	}}}
}

func directSystem(c *directclient.Client) *rtSystem {
	return &rtSystem{runs: []func(context.Context) (outcome, error){func(ctx context.Context) (outcome, error) {
		status, err := c.Execute(ctx, "1+1")
		return outcome{status: status, text: "2"}, err // the direct client reads no result
	}}}
}

// wsSystem starts a kernel on s and returns a system that runs over its
// websocket; close deletes the kernel.
func wsSystem(ctx context.Context, s *server, spec string, v1 bool) (sys *rtSystem, close func(), err error) {
	id, err := s.startKernel(ctx, spec)
	if err != nil {
		return nil, nil, err
	}
	ws, err := dialKernel(ctx, s, id, v1)
	if err != nil {
		s.deleteKernel(context.Background(), id)
		return nil, nil, err
	}
	close = func() {
		ws.Close()
		s.deleteKernel(context.Background(), id)
	}
	if err := ws.kernelInfo(ctx); err != nil {
		close()
		return nil, nil, err
	}
	return &rtSystem{runs: []func(context.Context) (outcome, error){
		func(ctx context.Context) (outcome, error) { return ws.execute(ctx, "1+1", 0) }}}, close, nil
}

// restSystem runs POST /api/execute on a context of language of its own
// (created here; close deletes it), through a restConn.
func restSystem(ctx context.Context, s *server, language string) (*rtSystem, func(), error) {
	id, _, err := s.createContext(ctx, language)
	if err != nil {
		return nil, nil, err
	}
	c, err := newRESTConn(s)
	if err != nil {
		s.deleteContext(context.Background(), id)
		return nil, nil, err
	}
	body, _ := json.Marshal(map[string]any{"code": "1+1", "context": id})
	return &rtSystem{runs: []func(context.Context) (outcome, error){func(ctx context.Context) (outcome, error) {
			missing, err := c.execute(ctx, body, "2")
			if missing {
				return outcome{status: "ok"}, err
			}
			return outcome{status: "ok", text: "2"}, err
		}}}, func() {
			c.Close()
			s.deleteContext(context.Background(), id)
		}, nil
}

func (b *bench) roundTrip(ctx context.Context, specName, language string) error {
	spec, _ := b.specs.Get(specName)
	sctx, cancel := within(ctx, 5*time.Minute)
	defer cancel()
	// Removed after the closers below have shut its kernels down.
	runtime, err := os.MkdirTemp("", "kgbench-client-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(runtime)
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	per := b.opt.rtKernels
	// startSystems joins n systems that start makes, each on a kernel or
	// context of its own, and charges their CPU to gateway s (nil: they
	// run in the harness).
	startSystems := func(s *server, n int, start func() (*rtSystem, func(), error)) (*rtSystem, error) {
		var all []*rtSystem
		for range n {
			var sys *rtSystem
			var close func()
			err := b.retry(func() error {
				var err error
				sys, close, err = start()
				return err
			})
			if err != nil {
				return nil, err
			}
			closers = append(closers, close)
			all = append(all, sys)
		}
		j := join(all...)
		if s != nil {
			j.procs, j.cpuOf = nil, "gateway"
			for range j.runs {
				j.procs = append(j.procs, s.pid)
			}
		}
		return j, nil
	}
	// newDirect starts direct clients, through relay processes when
	// relayed, whose CPU their round trips are then charged with.
	newDirect := func(relayed bool) (*rtSystem, error) {
		return startSystems(nil, per, func() (*rtSystem, func(), error) {
			var relay directclient.Relay
			relayPID := 0
			if relayed {
				relay = func(kernel [5]int) ([5]int, func(), error) {
					dial, stop, pid, err := startRelay(kernel)
					relayPID = pid
					return dial, stop, err
				}
			}
			c, err := directclient.StartThrough(sctx, spec, relay)
			if err != nil {
				return nil, nil, err
			}
			sys := directSystem(c)
			if relayed {
				sys.procs, sys.cpuOf = []func() int{func() int { return relayPID }}, "relay"
			}
			return sys, func() { c.Close() }, nil
		})
	}
	newWS := func(s *server, v1 bool, n int) (*rtSystem, error) {
		return startSystems(s, n, func() (*rtSystem, func(), error) { return wsSystem(sctx, s, specName, v1) })
	}
	newREST := func(s *server) (*rtSystem, error) {
		return startSystems(s, per, func() (*rtSystem, func(), error) { return restSystem(sctx, s, language) })
	}
	direct, err := newDirect(false)
	if err != nil {
		return err
	}
	// A second direct client on a kernel of its own is the control: how far
	// two kernel processes of one kernelspec differ with the same client.
	control, err := newDirect(false)
	if err != nil {
		return err
	}
	// The direct client through a byte relay process: the floor of any
	// process between a client and a kernel.
	relayed, err := newDirect(true)
	if err != nil {
		return err
	}
	// kernelgate's kernel client in the harness: what the websocket adds
	// to kernelgate's own kernel side is the hop alone.
	client, err := startSystems(nil, per, func() (*rtSystem, func(), error) {
		k, err := jupyter.Start(sctx, &local.Provisioner{RuntimeDir: runtime}, jupyter.Config{Spec: spec})
		if err != nil {
			return nil, nil, err
		}
		return kernelClientSystem(k), func() { k.Shutdown(context.Background()) }, nil
	})
	if err != nil {
		return err
	}
	kgV1, err := newWS(b.kg, true, per)
	if err != nil {
		return err
	}
	kgJSON, err := newWS(b.kg, false, per)
	if err != nil {
		return err
	}
	js, err := newWS(b.js, false, 1)
	if err != nil {
		return err
	}
	rest, err := newREST(b.kg)
	if err != nil {
		return err
	}
	systems := []*rtSystem{direct, kgV1, kgJSON, rest, js, control, relayed, client}
	var restOff, wsOff, bV1, bJSON, bREST *rtSystem
	if language != "python" {
		if restOff, err = newREST(b.kgOff); err != nil {
			return err
		}
		// Without the wait, the websocket does not hold a request's idle
		// status back for its late execute_result: the hold's cost.
		if wsOff, err = newWS(b.kgOff, true, per); err != nil {
			return err
		}
		systems = append(systems, restOff, wsOff)
	}
	if b.kgB != nil {
		if bV1, err = newWS(b.kgB, true, per); err != nil {
			return err
		}
		if bJSON, err = newWS(b.kgB, false, per); err != nil {
			return err
		}
		if bREST, err = newREST(b.kgB); err != nil {
			return err
		}
		systems = append(systems, bV1, bJSON, bREST)
	}

	progress("round trip, %s: %d warm-up round trips each", specName, b.opt.warmup)
	for range b.opt.warmup {
		for _, s := range systems {
			if err := s.step(sctx); err != nil {
				return err
			}
		}
	}
	for _, s := range systems {
		s.lat, s.late, s.cpu = nil, 0, 0
	}
	// Each turn takes the systems in a new order: a system that always
	// ran right after another would inherit its wake (after Jupyter
	// Server's 46 ms, mostly idle, the next round trip starts on idle
	// cores). The seed is fixed, so runs take the same orders.
	order := rand.New(rand.NewPCG(1, uint64(len(systems))))
	for i := range b.opt.roundTrips {
		if i%100 == 0 {
			progress("round trip, %s: %d/%d", specName, i, b.opt.roundTrips)
		}
		for _, j := range order.Perm(len(systems)) {
			if err := systems[j].step(sctx); err != nil {
				return err
			}
		}
	}

	name := "`1+1` round trip, " + specName
	d := direct.lat
	// Rows of clients in the harness, against the direct client.
	for _, c := range []struct {
		what, short string
		s           *rtSystem
	}{
		{"control: a second direct client on a kernel of its own", "direct 2", control},
		{"floor: the direct client through a byte relay process", "relayed", relayed},
		{"kernelgate's kernel client (package jupyter) in the harness, no gateway", "client", client},
	} {
		b.add(row{figure: name + ", " + c.what, direct: lat(c.s.lat),
			ratios: c.short + "/direct " + ratio(ms(c.s.lat.p50()), ms(d.p50())) + " (paired " + fmtDiff(paired(c.s.lat, d)) + ")" + c.s.cpuNote()})
	}
	b.add(row{figure: name + ", websocket v1", kg: lat(kgV1.lat) + lateNote(kgV1.late), direct: lat(d), ratios: ratios(kgV1.lat, d, nil, true) + kgV1.cpuNote()})
	b.add(row{figure: name + ", websocket JSON", kg: lat(kgJSON.lat) + lateNote(kgJSON.late), direct: lat(d),
		js: lat(js.lat) + lateNote(js.late), ratios: ratios(kgJSON.lat, d, js.lat, true) + kgJSON.cpuNote() + "; JS" + strings.TrimPrefix(js.cpuNote(), "; gateway")})
	b.add(row{figure: name + ", POST /api/execute", kg: lat(rest.lat) + missingNote(rest.late), direct: lat(d),
		ratios: ratios(rest.lat, d, nil, true) + "; REST − websocket v1 paired " + fmtDiff(paired(rest.lat, kgV1.lat)) + rest.cpuNote()})
	if restOff != nil {
		b.add(row{figure: name + ", POST /api/execute with --late-output-wait=-1ms", kg: lat(restOff.lat) + missingNote(restOff.late),
			direct: lat(d), ratios: ratios(restOff.lat, d, nil, true) + restOff.cpuNote()})
		b.add(row{figure: name + ", websocket v1 with --late-output-wait=-1ms (idle not held for late results)", kg: lat(wsOff.lat) + lateNote(wsOff.late),
			direct: lat(d), ratios: ratios(wsOff.lat, d, nil, true) + "; held/not held paired " + fmtDiff(paired(kgV1.lat, wsOff.lat)) + wsOff.cpuNote()})
	}
	if bV1 != nil {
		b.add(row{figure: name + ", websocket v1, kernelgate B", kg: lat(bV1.lat) + lateNote(bV1.late), direct: lat(d),
			ratios: ratios(bV1.lat, d, nil, true) + "; B/A paired " + fmtDiff(paired(bV1.lat, kgV1.lat)) + bV1.cpuNote()})
		b.add(row{figure: name + ", websocket JSON, kernelgate B", kg: lat(bJSON.lat) + lateNote(bJSON.late), direct: lat(d),
			ratios: ratios(bJSON.lat, d, nil, true) + "; B/A paired " + fmtDiff(paired(bJSON.lat, kgJSON.lat)) + bJSON.cpuNote()})
		b.add(row{figure: name + ", POST /api/execute, kernelgate B", kg: lat(bREST.lat) + missingNote(bREST.late), direct: lat(d),
			ratios: ratios(bREST.lat, d, nil, true) + "; B/A paired " + fmtDiff(paired(bREST.lat, rest.lat)) + bREST.cpuNote()})
	}
	for _, w := range []struct {
		name string
		s    sample
	}{{"v1", kgV1.lat}, {"JSON", kgJSON.lat}} {
		p := paired(w.s, d)
		b.check(fmt.Sprintf("websocket %s round trip on %s within 0.3 ms of direct", w.name, specName), p <= 300*time.Microsecond,
			"paired difference %s, p50 %s vs %s ms; control %s; floor (relay) %s, kernelgate against it %s; against kernelgate's kernel client in the harness %s", fmtPaired(w.s, d), fmtMS(w.s.p50()), fmtMS(d.p50()), fmtPaired(control.lat, d), fmtDiff(paired(relayed.lat, d)), fmtDiff(paired(w.s, relayed.lat)), fmtDiff(paired(w.s, client.lat)))
		if relay := paired(relayed.lat, d); relay > 300*time.Microsecond && paired(w.s, relayed.lat) <= 0 {
			b.missedBecause(fmt.Sprintf("a process that only copies the bytes between the client and the kernel adds %s on this machine in this run, more than the 0.3 ms allowed, and kernelgate is no slower than it; see \"What each row means and where the time goes\"", fmtDiff(relay)))
		}
	}
	// The REST path against the websocket's, both kernelgate on kernels
	// of the same spec, turn by turn; the control says how far two sets
	// of kernels differ.
	p := paired(rest.lat, kgV1.lat)
	b.check("POST /api/execute `1+1` on "+specName+" within +0.1 ms of the websocket v1 round trip (paired)", p <= 100*time.Microsecond,
		"paired difference %s, p50 %s vs %s ms; control %s; gateway CPU %s against %s per round trip",
		fmtPaired(rest.lat, kgV1.lat), fmtMS(rest.lat.p50()), fmtMS(kgV1.lat.p50()), fmtPaired(control.lat, d), cpuPer(rest), cpuPer(kgV1))
	floor := "; floor (relay) " + fmtDiff(paired(relayed.lat, d)) + "; against kernelgate's kernel client in the harness " + fmtDiff(paired(rest.lat, client.lat))
	if language == "python" {
		r := ms(rest.lat.p50()) / ms(d.p50())
		b.check("POST /api/execute `1+1` on python3 within 7% of direct", r <= 1.07,
			"p50 %s vs %s ms, ratio %.3f; paired %s%s", fmtMS(rest.lat.p50()), fmtMS(d.p50()), r, fmtPaired(rest.lat, d), floor)
	} else {
		p := paired(rest.lat, d)
		b.check("POST /api/execute `1+1` on "+specName+" within 0.5 ms of direct", p <= 500*time.Microsecond,
			"paired difference %s, p50 %s vs %s ms%s", fmtPaired(rest.lat, d), fmtMS(rest.lat.p50()), fmtMS(d.p50()), floor)
	}
	return nil
}

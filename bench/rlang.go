//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"kernelgate/internal/directclient"
)

// rSpec is IRkernel's kernelspec, which `make kernels` writes.
const rSpec = "ir"

// benchR measures the R kernel (IRkernel):
//   - start → ready, interleaved: the direct client (spawn → kernel_info
//     reply and an iopub message), kernelgate and Jupyter Server
//     (POST /api/kernels → kernel_info_reply over the websocket);
//   - the `1+1` round trip of POST /api/execute with language r (until the
//     Execution with its result `[1] 2` is read) against the direct client
//     (until the reply and status: idle), and over kernelgate's and Jupyter
//     Server's websockets, in turns of a new order each.
func (b *bench) benchR(ctx context.Context) error {
	spec, err := b.specs.Get(rSpec)
	if err != nil {
		return fmt.Errorf("kernelspec %s: %w (run make kernels: R and IRkernel)", rSpec, err)
	}

	var direct, kg, js sample
	steps := []func() error{
		func() error {
			sctx, cancel := within(ctx, 2*time.Minute)
			defer cancel()
			t0 := time.Now()
			c, err := directclient.Start(sctx, spec)
			if err != nil {
				return err
			}
			direct = append(direct, time.Since(t0))
			c.Close()
			return nil
		},
		func() error {
			d, err := startToReady(ctx, b.kg, rSpec, true)
			if err == nil {
				kg = append(kg, d)
			}
			return err
		},
		func() error {
			d, err := startToReady(ctx, b.js, rSpec, false)
			if err == nil {
				js = append(js, d)
			}
			return err
		},
	}
	if err := b.interleave("start → ready, "+rSpec, steps, func() { direct, kg, js = nil, nil, nil }, b.opt.starts); err != nil {
		return err
	}
	b.add(row{figure: "Start → ready, " + rSpec + " (R 4, IRkernel; kernelgate and Jupyter Server: POST /api/kernels → kernel_info_reply over the websocket)",
		kg: lat(kg), direct: lat(direct), js: lat(js), ratios: ratios(kg, direct, js, true)})

	sctx, cancel := within(ctx, 5*time.Minute)
	defer cancel()
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	dc, err := directclient.Start(sctx, spec)
	if err != nil {
		return err
	}
	closers = append(closers, func() { dc.Close() })
	directSys := directSystem(dc)

	id, _, err := b.kg.createContext(sctx, "r")
	if err != nil {
		return err
	}
	closers = append(closers, func() { b.kg.deleteContext(context.Background(), id) })
	conn, err := newRESTConn(b.kg)
	if err != nil {
		return err
	}
	closers = append(closers, func() { conn.Close() })
	body, _ := json.Marshal(map[string]any{"code": "1+1", "context": id})
	rest := &rtSystem{runs: []func(context.Context) (outcome, error){func(ctx context.Context) (outcome, error) {
		missing, err := conn.execute(ctx, body, "[1] 2")
		if missing {
			return outcome{status: "ok"}, fmt.Errorf("POST /api/execute: R's 1+1 gave no result")
		}
		return outcome{status: "ok", text: "2"}, err
	}}, procs: []func() int{b.kg.pid}, cpuOf: "gateway"}

	// IRkernel shows a value with display_data, which the websocket
	// clients do not read: their rows are reply and idle, as the direct
	// client's.
	kgWS, closeKG, err := wsSystem(sctx, b.kg, rSpec, true)
	if err != nil {
		return err
	}
	closers = append(closers, closeKG)
	kgWS.procs, kgWS.cpuOf = []func() int{b.kg.pid}, "gateway"
	jsWS, closeJS, err := wsSystem(sctx, b.js, rSpec, false)
	if err != nil {
		return err
	}
	closers = append(closers, closeJS)

	systems := []*rtSystem{directSys, rest, kgWS, jsWS}
	n := max(b.opt.roundTrips/2, 10)
	progress("round trip, %s: %d warm-up round trips each", rSpec, b.opt.warmup)
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
	order := rand.New(rand.NewPCG(2, uint64(len(systems))))
	for i := range n {
		if i%100 == 0 {
			progress("round trip, %s: %d/%d", rSpec, i, n)
		}
		for _, j := range order.Perm(len(systems)) {
			if err := systems[j].step(sctx); err != nil {
				return err
			}
		}
	}
	name := "`1+1` round trip, " + rSpec
	d := directSys.lat
	b.add(row{figure: name + ", POST /api/execute with language r (its result `[1] 2` read)", kg: lat(rest.lat), direct: lat(d),
		ratios: ratios(rest.lat, d, nil, true) + rest.cpuNote()})
	b.add(row{figure: name + ", websocket v1 (reply and idle)", kg: lat(kgWS.lat), direct: lat(d), js: lat(jsWS.lat),
		ratios: ratios(kgWS.lat, d, jsWS.lat, true) + kgWS.cpuNote()})
	return nil
}

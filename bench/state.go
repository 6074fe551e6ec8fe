//go:build linux

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"kernelgate/internal/pgtest"
)

// benchState measures what the state store costs and buys (docs/state.md):
//   - execute latency, POST /api/execute of 1+1 in a Python context, on a
//     kernelgate keeping its state (--state-dir) and on one keeping it in
//     memory (--state-dir ”), interleaved one for one: with the store on
//     each run's record and events are written in the store's batches
//     (a synchronous run hands its id out only with its end, so it
//     waits for no commit); the difference is what those writes cost;
//   - throughput, runs a second finishing on several contexts at once,
//     each run writing its record and its events, store on and off in
//     turn: the runs' writes share the store's commits;
//   - the PostgreSQL store (--state-url) against bbolt: the same latency
//     and throughput (benchStatePG);
//   - the time from the start of a kernelgate to serving when the
//     kernelgate before it left opt.adopt kernels running
//     (--keep-kernels): every one is adopted (same process, answering
//     kernel_info with its key) before it serves.
//
// It runs alone with -only state.
func (b *bench) benchState(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "kgbench-state-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sctx, cancel := within(ctx, 2*time.Minute)
	on, err := startKernelgate(sctx, "kernelgate (store on)", kernelgateBin, "--pool-size", "0", "--state-dir", filepath.Join(dir, "on"))
	if err != nil {
		cancel()
		return err
	}
	defer on.stop()
	off, err := startKernelgate(sctx, "kernelgate (store off)", kernelgateBin, "--pool-size", "0", "--state-dir", "")
	cancel()
	if err != nil {
		return err
	}
	defer off.stop()

	// Latency.
	type side struct {
		s    *server
		conn *restConn
		body []byte
		lat  sample
	}
	sides := []*side{{s: on}, {s: off}}
	for _, sd := range sides {
		cctx, cancel := within(ctx, 2*time.Minute)
		id, _, err := sd.s.createContext(cctx, "python")
		cancel()
		if err != nil {
			return err
		}
		if sd.conn, err = newRESTConn(sd.s); err != nil {
			return err
		}
		defer sd.conn.Close()
		sd.body, _ = json.Marshal(map[string]any{"context": id, "code": "1+1"})
	}
	lats, err := b.interleavedExecutes(ctx, "state: latency", []*restConn{sides[0].conn, sides[1].conn}, [][]byte{sides[0].body, sides[1].body})
	if err != nil {
		return err
	}
	sides[0].lat, sides[1].lat = lats[0], lats[1]
	b.add(row{figure: "POST /api/execute 1+1, Python context, store on", kg: lat(sides[0].lat),
		ratios: "on − off paired " + fmtPaired(sides[0].lat, sides[1].lat)})
	b.add(row{figure: "POST /api/execute 1+1, Python context, store off (--state-dir '')", kg: lat(sides[1].lat)})

	// Throughput: contexts × one client each, every client running
	// stateRuns runs; store on and off in turn.
	best, err := bestThroughput(ctx, []*server{on, off}, stateClients, stateRuns)
	if err != nil {
		return err
	}
	rOn, rOff := best[on], best[off]
	const clients = stateClients
	b.add(row{figure: fmt.Sprintf("runs/s, %d Python contexts × 1 client, store on", clients), kg: fmt.Sprintf("%.0f", rOn),
		ratios: fmt.Sprintf("on/off %.2f", rOn/rOff)})
	b.add(row{figure: fmt.Sprintf("runs/s, %d Python contexts × 1 client, store off", clients), kg: fmt.Sprintf("%.0f", rOff)})
	// A synchronous run's writes are batched with the other runs': no
	// commit of its own, none waited for.
	b.check("runs/s with the store on at least 0.8 of off: concurrent runs share their commits",
		rOn >= 0.8*rOff,
		"p50 %s ms on, %s ms off (writes batched, no commit waited for); %.0f against %.0f runs/s", fmtMS(sides[0].lat.p50()), fmtMS(sides[1].lat.p50()), rOn, rOff)
	if err := b.benchStatePG(ctx, on, sides[0].conn, sides[0].body); err != nil {
		return err
	}
	return b.benchReadopt(ctx, dir)
}

// benchStatePG compares the PostgreSQL store (--state-url, a private
// server on this machine: initdb by internal/pgtest) with bbolt (on):
// execute latency interleaved one for one, and runs a second on several
// contexts. The goal: p50 within +0.5 ms of bbolt's, runs/s at least
// 0.9 of bbolt's. Without PostgreSQL the rows say so.
func (b *bench) benchStatePG(ctx context.Context, bolt *server, boltConn *restConn, boltBody []byte) error {
	srv, err := pgtest.Launch()
	if errors.Is(err, pgtest.ErrMissing) {
		b.add(row{figure: "POST /api/execute 1+1, Python context, PostgreSQL store", kg: "—", ratios: err.Error()})
		return nil
	}
	if err != nil {
		return err
	}
	defer srv.Close()
	url, err := srv.CreateDB("kernelgate")
	if err != nil {
		return err
	}
	sctx, cancel := within(ctx, 2*time.Minute)
	pg, err := startKernelgate(sctx, "kernelgate (PostgreSQL store)", kernelgateBin, "--pool-size", "0", "--state-url", url)
	cancel()
	if err != nil {
		return err
	}
	defer pg.stop()
	cctx, cancel := within(ctx, 2*time.Minute)
	id, _, err := pg.createContext(cctx, "python")
	cancel()
	if err != nil {
		return err
	}
	pgConn, err := newRESTConn(pg)
	if err != nil {
		return err
	}
	defer pgConn.Close()
	pgBody, _ := json.Marshal(map[string]any{"context": id, "code": "1+1"})
	lats, err := b.interleavedExecutes(ctx, "state: PostgreSQL latency", []*restConn{pgConn, boltConn}, [][]byte{pgBody, boltBody})
	if err != nil {
		return err
	}
	latPG, latBolt := lats[0], lats[1]
	b.add(row{figure: "POST /api/execute 1+1, Python context, PostgreSQL store (--state-url, local server)", kg: lat(latPG),
		ratios: "PostgreSQL − bbolt paired " + fmtPaired(latPG, latBolt)})

	best, err := bestThroughput(ctx, []*server{pg, bolt}, stateClients, stateRuns)
	if err != nil {
		return err
	}
	b.add(row{figure: fmt.Sprintf("runs/s, %d Python contexts × 1 client, PostgreSQL store", stateClients), kg: fmt.Sprintf("%.0f", best[pg]),
		ratios: fmt.Sprintf("PostgreSQL/bbolt %.2f (bbolt %.0f)", best[pg]/best[bolt], best[bolt])})
	dp50 := latPG.p50() - latBolt.p50()
	b.check("the PostgreSQL store: execute p50 within +0.5 ms of bbolt's, runs/s at least 0.9 of bbolt's",
		dp50 <= 500*time.Microsecond && best[pg] >= 0.9*best[bolt],
		"p50 %s ms against %s ms; %.0f against %.0f runs/s", fmtMS(latPG.p50()), fmtMS(latBolt.p50()), best[pg], best[bolt])
	return nil
}

// stateClients contexts, one client each, run stateRuns runs each in a
// throughput round.
const stateClients, stateRuns = 8, 100

// interleavedExecutes sends each body on its connection in turn,
// opt.warmup + opt.roundTrips times, and returns each one's latencies
// after the warm-up.
func (b *bench) interleavedExecutes(ctx context.Context, what string, conns []*restConn, bodies [][]byte) ([]sample, error) {
	lats := make([]sample, len(conns))
	n := b.opt.warmup + b.opt.roundTrips
	for i := range n {
		for j, conn := range conns {
			rctx, cancel := within(ctx, time.Minute)
			d, err := measure(func() error {
				_, err := conn.execute(rctx, bodies[j], "2")
				return err
			})
			cancel()
			if err != nil {
				return nil, err
			}
			if i >= b.opt.warmup {
				lats[j] = append(lats[j], d)
			}
		}
		if (i+1)%200 == 0 {
			progress("%s %d/%d", what, i+1, n)
		}
	}
	return lats, nil
}

// bestThroughput makes clients Python contexts on each server, then
// runs three rounds of throughput on them, the servers in turn, and
// returns each server's best runs a second after the first round (which
// warms up).
func bestThroughput(ctx context.Context, servers []*server, clients, runs int) (map[*server]float64, error) {
	ids := map[*server][]string{}
	for _, s := range servers {
		for range clients {
			cctx, cancel := within(ctx, 2*time.Minute)
			id, _, err := s.createContext(cctx, "python")
			cancel()
			if err != nil {
				return nil, err
			}
			ids[s] = append(ids[s], id)
		}
	}
	best := map[*server]float64{}
	for round := range 3 {
		for _, s := range servers {
			rate, err := throughput(ctx, s, ids[s], runs)
			if err != nil {
				return nil, err
			}
			if round > 0 {
				best[s] = max(best[s], rate)
			}
		}
	}
	return best, nil
}

// throughput runs count runs in each context, one client each, and
// returns the runs finished a second.
func throughput(ctx context.Context, s *server, ids []string, count int) (float64, error) {
	var wg sync.WaitGroup
	errs := make(chan error, len(ids))
	t0 := time.Now()
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := newRESTConn(s)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			body, _ := json.Marshal(map[string]any{"context": id, "code": "1+1"})
			for range count {
				rctx, cancel := within(ctx, time.Minute)
				_, err := conn.execute(rctx, body, "2")
				cancel()
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(t0)
	select {
	case err := <-errs:
		return 0, err
	default:
	}
	return float64(len(ids)*count) / took.Seconds(), nil
}

// benchReadopt starts opt.adopt Python contexts on a kernelgate with
// --keep-kernels, stops it with SIGTERM, and times the start of the next
// one on the same state directory until it serves with every kernel
// adopted.
func (b *bench) benchReadopt(ctx context.Context, dir string) error {
	n := b.opt.adopt
	stateDir, runtimeDir := filepath.Join(dir, "readopt"), filepath.Join(dir, "readopt-runtime")
	args := []string{"--pool-size", "0", "--state-dir", stateDir, "--runtime-dir", runtimeDir}
	sctx, cancel := within(ctx, 2*time.Minute)
	first, err := startKernelgate(sctx, "kernelgate (keeps kernels)", kernelgateBin, append(args, "--keep-kernels")...)
	cancel()
	if err != nil {
		return err
	}
	defer first.stop()
	var pids []int
	for i := range n {
		cctx, cancel := within(ctx, 2*time.Minute)
		var c struct {
			KernelProcessID int `json:"kernelProcessId"`
		}
		err := first.expect(cctx, 201, "POST", "api/contexts", map[string]string{"language": "python"}, &c)
		cancel()
		if err != nil {
			return err
		}
		pids = append(pids, c.KernelProcessID)
		if (i+1)%10 == 0 {
			progress("state: %d/%d kernels started", i+1, n)
		}
	}
	first.stop()
	for _, pid := range pids {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			return fmt.Errorf("kernel %d did not outlive kernelgate --keep-kernels", pid)
		}
	}
	sctx, cancel = within(ctx, 5*time.Minute)
	defer cancel()
	var second *server
	took, err := measure(func() error {
		var err error
		second, err = startKernelgate(sctx, "kernelgate (adopts kernels)", kernelgateBin, args...)
		return err
	})
	if err != nil {
		return err
	}
	defer second.stop() // shuts the kernels down
	got, err := second.kernelCount(sctx)
	if err != nil {
		return err
	}
	if got != n {
		return fmt.Errorf("%d of %d kept kernels adopted", got, n)
	}
	b.add(row{figure: fmt.Sprintf("start → serving with %d kept Python kernels to adopt", n), kg: fmtMS(took) + " ms",
		ratios: fmt.Sprintf("%.1f ms a kernel", ms(took)/float64(n))})
	return nil
}

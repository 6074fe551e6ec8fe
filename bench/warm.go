//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// benchWarm measures new contexts served from the warm pool, in a gateway
// of its own (--pool-size 1 --pool-max 4, both languages prewarmed): a new
// context → the result of `1+1` in it while a pooled kernel is ready, for
// python3 and Deno; new Python contexts arriving at 1 and at 10 a second,
// the pool sizing itself to the rate; and the memory the pool holds at
// rest once it has shrunk back to its floor.
func (b *bench) benchWarm(ctx context.Context) error {
	sctx, cancel := within(ctx, 15*time.Minute)
	defer cancel()
	// Memory only: a kernel kept for a restart (a state directory) has a
	// watchdog child beside it.
	s, err := startKernelgate(sctx, "kernelgate (warm contexts)", kernelgateBin, "--pool-size", "1", "--pool-max", "4",
		"--pool-idle", "5s", "--pool-prewarm", "python,javascript", "--state-dir", "")
	if err != nil {
		return err
	}
	defer s.stop()

	takes := func(spec string) (hit, miss int) {
		m, _ := s.metrics(sctx)
		return int(m[`kernelgate_pool_takes_total{result="hit",spec="`+spec+`"}`]), int(m[`kernelgate_pool_takes_total{result="miss",spec="`+spec+`"}`])
	}
	contextRun := func(language string, out *sample, mu *sync.Mutex) error {
		rctx, cancel := within(sctx, 2*time.Minute)
		defer cancel()
		var id string
		d, err := measure(func() error {
			var err error
			if id, _, err = s.createContext(rctx, language); err != nil {
				return err
			}
			_, err = s.execute(rctx, map[string]any{"code": "1+1", "context": id}, "2")
			return err
		})
		if id != "" {
			if derr := s.deleteContext(rctx, id); err == nil {
				err = derr
			}
		}
		if err == nil {
			if mu != nil {
				mu.Lock()
				defer mu.Unlock()
			}
			*out = append(*out, d)
		}
		return err
	}

	// One new context at a time, each with a ready kernel in the pool and
	// the machine at rest.
	// Takes are spaced by more than the pool's rate window (2 s), so that
	// it stays at its floor: two kernels in all, python3 and deno.
	ready := map[string]sample{}
	var last time.Time
	for _, k := range kernels {
		var smp sample
		h0, m0 := takes(k.spec)
		for i := 0; i < b.opt.poolRuns; i++ {
			time.Sleep(time.Until(last.Add(2100 * time.Millisecond)))
			if err := s.waitPool(sctx, k.spec, 1); err != nil {
				return err
			}
			if err := waitNoKernelsBut(sctx, s.pid(), 2); err != nil {
				return err
			}
			time.Sleep(settleAfterStart)
			last = time.Now()
			if err := b.retry(func() error { return contextRun(k.language, &smp, nil) }); err != nil {
				return err
			}
		}
		h1, m1 := takes(k.spec)
		ready[k.spec] = smp
		b.add(row{figure: "New context → first result with a ready pooled kernel, " + k.spec + " (POST /api/contexts then `1+1`, one at a time, the pool refilled between them)",
			kg: lat(smp) + fmt.Sprintf("; %d of %d from the pool", h1-h0, (h1-h0)+(m1-m0))})
	}

	// New contexts at a steady rate, without waiting for each other.
	rates := []struct {
		every    time.Duration
		arrivals int
	}{{time.Second, 20}, {100 * time.Millisecond, 50}}
	for _, r := range rates {
		if err := s.waitPool(sctx, "python3", 1); err != nil {
			return err
		}
		time.Sleep(settleAfterStart)
		h0, m0 := takes("python3")
		progress("warm: %d new python contexts at one every %v", r.arrivals, r.every)
		var smp sample
		var mu sync.Mutex
		var wg sync.WaitGroup
		var rateErr error
		tick := time.NewTicker(r.every)
		for i := 0; i < r.arrivals && sctx.Err() == nil; i++ {
			if i > 0 {
				select {
				case <-tick.C:
				case <-sctx.Done():
				}
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := contextRun("python", &smp, &mu); err != nil {
					mu.Lock()
					rateErr = err
					mu.Unlock()
				}
			}()
		}
		tick.Stop()
		wg.Wait()
		if rateErr != nil {
			return rateErr
		}
		h1, m1 := takes("python3")
		perSecond := float64(time.Second) / float64(r.every)
		b.add(row{figure: fmt.Sprintf("New Python contexts at %g a second (%d, each deleted after its result), adaptive pool 1 to 4: context → first result", perSecond, r.arrivals),
			kg: lat(smp) + fmt.Sprintf("; %d of %d from the pool", h1-h0, (h1-h0)+(m1-m0))})
		b.check(fmt.Sprintf("new Python contexts at %g a second → first result ≤ 80 ms p50 with the adaptive pool", perSecond),
			len(smp) > 0 && smp.p50() <= 80*time.Millisecond, "%s ms p50, %s ms p90", fmtMS(smp.p50()), fmtMS(smp.p90()))
	}

	// The pool at rest: back at its floor (one python3, one deno kernel).
	progress("warm: waiting for the pools to shrink back to their floor")
	if err := waitNoKernelsBut(sctx, s.pid(), 2); err != nil {
		return err
	}
	time.Sleep(densitySettle)
	var pyPSS, denoPSS, zygote int64
	for _, pid := range childrenOf(s.pid()) {
		total := int64(0)
		for _, p := range append([]int{pid}, descendants(pid)...) {
			v, err := pssOf(p)
			if err != nil {
				return err
			}
			total += v
		}
		switch {
		case isZygote(pid):
			zygote += total
		case isDenoProcess(pid):
			denoPSS += total
		default:
			pyPSS += total
		}
	}
	b.add(row{figure: "Memory of the warm pool at rest (--pool-size 1: one ready python3 and one deno kernel; PSS of all their processes)",
		kg: fmt.Sprintf("%.1f MiB: python3 %.1f MiB (+ its zygote %.1f MiB, there with or without the pool), deno %.1f MiB", mib(pyPSS+denoPSS), mib(pyPSS), mib(zygote), mib(denoPSS))})

	py := ready["python3"]
	b.check("new Python context → first result with a ready pooled kernel ≤ 25 ms p50", len(py) > 0 && py.p50() <= 25*time.Millisecond,
		"%s ms p50, %s ms p90", fmtMS(py.p50()), fmtMS(py.p90()))
	return nil
}

// waitNoKernelsBut waits until the gateway pid has at most n children
// besides its zygotes (the pool's kernels at its floor).
func waitNoKernelsBut(ctx context.Context, gateway, n int) error {
	for {
		k := 0
		for _, c := range childrenOf(gateway) {
			if !isZygote(c) {
				k++
			}
		}
		if k <= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d kernel processes still run under %d: %w", k, gateway, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// isDenoProcess reports whether pid runs deno.
func isDenoProcess(pid int) bool {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	argv0, _, _ := strings.Cut(string(b), "\x00")
	return strings.HasSuffix(argv0, "deno")
}

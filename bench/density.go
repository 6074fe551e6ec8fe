//go:build linux

package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// densitySettle is how long a gateway rests after kernels started before
// its memory is read.
const densitySettle = 3 * time.Second

// benchDensity starts a fresh kernelgate (pool off) and a fresh Jupyter
// Server, reads their RSS (and kernelgate's goroutines) with 0, 10 and 50
// idle python3 kernels (Jupyter Server: 0 and 10), then their CPU time
// and wakeups over an idle window in which nothing talks to either.
func (b *bench) benchDensity(ctx context.Context) error {
	const specName = "python3"
	o := b.opt
	sctx, cancel := within(ctx, 10*time.Minute)
	defer cancel()
	kg, err := startKernelgate(sctx, "kernelgate (density)", kernelgateBin, "--pool-size", "0")
	if err != nil {
		return err
	}
	defer kg.stop()
	js, err := startJupyterServer(sctx)
	if err != nil {
		return err
	}
	defer js.stop()
	var jsKernels []string
	defer func() {
		for _, id := range jsKernels {
			js.deleteKernel(context.Background(), id)
		}
	}()
	time.Sleep(densitySettle)

	var kgRSS, jsRSS []int64
	var kgG []int
	var kgIDs []string
	for _, n := range o.density {
		progress("density: %d idle %s kernels in kernelgate", n, specName)
		start := n - len(kgIDs)
		ids := make([]string, max(start, 0))
		if err := parallel(len(ids), 2, func(i int) error {
			return b.retry(func() error {
				var err error
				ids[i], err = kg.startKernel(sctx, specName)
				return err
			})
		}); err != nil {
			return err
		}
		kgIDs = append(kgIDs, ids...)
		time.Sleep(densitySettle)
		rss, _, err := memStatus(kg.pid())
		if err != nil {
			return err
		}
		g, err := kg.goroutines(sctx)
		if err != nil {
			return err
		}
		kgRSS, kgG = append(kgRSS, rss), append(kgG, g)
	}
	for _, n := range []int{0, o.jsDensity} {
		progress("density: %d idle %s kernels in Jupyter Server", n, specName)
		ids := make([]string, max(n-len(jsKernels), 0))
		if err := parallel(len(ids), 2, func(i int) error {
			id, err := js.startKernel(sctx, specName)
			if err != nil {
				return err
			}
			ids[i] = id
			// Wait until the kernel is ready, as kernelgate's POST does.
			ws, err := dialKernel(sctx, js, id, false)
			if err != nil {
				return err
			}
			defer ws.Close()
			return ws.kernelInfo(sctx)
		}); err != nil {
			jsKernels = append(jsKernels, ids...) // deleted on the way out
			return err
		}
		jsKernels = append(jsKernels, ids...)
		time.Sleep(densitySettle)
		rss, _, err := memStatus(js.pid())
		if err != nil {
			return err
		}
		jsRSS = append(jsRSS, rss)
	}

	progress("density: both gateways idle for %v", o.idle)
	time.Sleep(time.Second)
	// The collections the Go runtime ran, read before and after the window
	// (the reads themselves fall outside it).
	gcs := func() float64 {
		m, err := kg.metrics(sctx)
		if err != nil {
			return -1
		}
		return m["go_gc_duration_seconds_count"]
	}
	gc0 := gcs()
	kgCPU0, _ := cpuTime(kg.pid())
	kgTicks0, _ := cpuTicks(kg.pid())
	kgWake0 := wakeups(kg.pid())
	jsCPU0, _ := cpuTime(js.pid())
	jsWake0 := wakeups(js.pid())
	time.Sleep(o.idle)
	kgCPU1, _ := cpuTime(kg.pid())
	kgTicks1, _ := cpuTicks(kg.pid())
	kgWake1 := wakeups(kg.pid())
	jsCPU1, _ := cpuTime(js.pid())
	jsWake1 := wakeups(js.pid())
	gc1 := gcs()

	last := len(o.density) - 1
	counts := make([]string, len(o.density))
	for i, n := range o.density {
		counts[i] = fmt.Sprint(n)
	}
	join := func(vs []int64) string {
		s := make([]string, len(vs))
		for i, v := range vs {
			s[i] = fmt.Sprintf("%.1f", mib(v))
		}
		return strings.Join(s, " / ") + " MiB"
	}
	gs := make([]string, len(kgG))
	for i, g := range kgG {
		gs[i] = fmt.Sprint(g)
	}
	nMax := o.density[last]
	kgPer := float64(kgRSS[last]-kgRSS[0]) / float64(nMax)
	jsPer := float64(jsRSS[1]-jsRSS[0]) / float64(o.jsDensity)
	b.add(row{figure: fmt.Sprintf("Gateway RSS with %s idle %s kernels (Jupyter Server: 0 / %d)", strings.Join(counts, " / "), specName, o.jsDensity),
		kg: join(kgRSS), js: join(jsRSS), ratios: "kg/JS at 0 " + ratio(float64(kgRSS[0]), float64(jsRSS[0]))})
	b.add(row{figure: "Gateway memory per idle kernel",
		kg: fmt.Sprintf("%.0f KiB", kgPer/1024), js: fmt.Sprintf("%.0f KiB", jsPer/1024), ratios: "kg/JS " + ratio(kgPer, jsPer)})
	b.add(row{figure: fmt.Sprintf("Gateway goroutines with %s idle kernels", strings.Join(counts, " / ")),
		kg: strings.Join(gs, " / ") + fmt.Sprintf(" (%.1f per kernel)", float64(kgG[last]-kgG[0])/float64(nMax))})
	kgIdle, jsIdle := kgCPU1-kgCPU0, jsCPU1-jsCPU0
	b.add(row{figure: fmt.Sprintf("Gateway CPU over %v idle (kernelgate: %d kernels; Jupyter Server: %d)", o.idle, nMax, o.jsDensity),
		kg: fmt.Sprintf("%.3f ms, %d wakeups", ms(kgIdle), kgWake1-kgWake0),
		js: fmt.Sprintf("%.1f ms, %d wakeups", ms(jsIdle), jsWake1-jsWake0)})
	b.check(fmt.Sprintf("zero idle CPU (kernelgate with %d idle kernels over %v)", nMax, o.idle),
		kgTicks1 == kgTicks0 && kgIdle < time.Millisecond,
		"%.3f ms CPU (%d clock ticks), %d wakeups", ms(kgIdle), (kgTicks1-kgTicks0)/(10*time.Millisecond), kgWake1-kgWake0)
	if gc0 >= 0 && gc1 > gc0 {
		b.missedBecause(fmt.Sprintf("the Go runtime ran %.0f garbage collection(s) in the window: it forces one when none "+
			"has run for 2 minutes, a few ms of CPU and its workers' wakeups once every 2 minutes of an idle gateway, "+
			"and a %v window catches it or not by chance", gc1-gc0, o.idle))
	}
	progress("density: stopping")
	return nil
}

//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"
)

// launcherPreload is what the python3 kernelspec's zygote imports in the
// launcher section (as scripts/install-kernels.sh writes it).
var launcherPreload = []string{"numpy", "pandas", "matplotlib"}

// benchLauncher compares the two ways Python kernels start, each in a
// gateway of its own with the warm pool off: forked from a zygote
// (--python-launcher fork) and exec'd (--python-launcher exec). Rows, runs
// interleaved: a new context → the result of `1+1` in it; an isolated run
// on a pool miss; and the proportional set size (PSS: shared pages count
// once over their sharers) of each idle kernel's processes, with and
// without its share of the zygote.
func (b *bench) benchLauncher(ctx context.Context) error {
	o := b.opt
	sctx, cancel := within(ctx, 15*time.Minute)
	defer cancel()
	specs, err := launcherSpecs()
	if err != nil {
		return err
	}
	defer os.RemoveAll(specs)
	start := func(name, launcher string) (*server, error) {
		// These two gateways read the copy, not the harness's specDir.
		saved := specDir
		specDir = specs
		defer func() { specDir = saved }()
		// Memory only: the harness counts the gateway's children as its
		// kernels, and a kernel kept for a restart (a state directory)
		// has a watchdog child beside it.
		return startKernelgate(sctx, name, kernelgateBin, "--pool-size", "0", "--late-output-wait=-1ms",
			"--python-launcher", launcher, "--state-dir", "")
	}
	fork, err := start("kernelgate (fork)", "fork")
	if err != nil {
		return err
	}
	defer fork.stop()
	exec, err := start("kernelgate (exec)", "exec")
	if err != nil {
		return err
	}
	defer exec.stop()

	var ctxFork, ctxExec, isoFork, isoExec sample
	contextRun := func(s *server, out *sample) func() error {
		return func() error {
			rctx, cancel := within(sctx, 2*time.Minute)
			defer cancel()
			var id string
			d, err := measure(func() error {
				var err error
				if id, _, err = s.createContext(rctx, "python"); err != nil {
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
				*out = append(*out, d)
			}
			return err
		}
	}
	isolated := func(s *server, out *sample) func() error {
		return func() error {
			rctx, cancel := within(sctx, 2*time.Minute)
			defer cancel()
			before, err := s.kernelCount(rctx)
			if err != nil {
				return err
			}
			d, err := measure(func() error {
				_, err := s.execute(rctx, map[string]any{"code": "1+1", "language": "python", "isolated": true}, "2")
				return err
			})
			if err != nil {
				return err
			}
			*out = append(*out, d)
			return s.waitKernels(rctx, before)
		}
	}
	// Each run starts on a quiet machine: the kernels of the run before
	// (an exec'd one burns a core for half a second) are gone.
	settled := func(step func() error) func() error {
		return func() error {
			if err := step(); err != nil {
				return err
			}
			for _, s := range []*server{fork, exec} {
				if err := waitNoKernels(sctx, s.pid()); err != nil {
					return err
				}
			}
			time.Sleep(settleAfterStart)
			return nil
		}
	}
	n := 3 * o.starts
	steps := []func() error{
		settled(contextRun(fork, &ctxFork)), settled(contextRun(exec, &ctxExec)),
		settled(isolated(fork, &isoFork)), settled(isolated(exec, &isoExec)),
	}
	reset := func() { ctxFork, ctxExec, isoFork, isoExec = nil, nil, nil, nil }
	if err := b.interleave("python launcher, fork and exec", steps, reset, n); err != nil {
		return err
	}

	// New contexts arriving at a steady rate, each created and asked
	// `1+1` without waiting for the others (forked only: exec'd starts at
	// that rate take more CPU than the machine has).
	var ctxRate sample
	var rateErr error
	{
		const arrivals, every = 50, 100 * time.Millisecond
		progress("launcher: %d new contexts at one every %v", arrivals, every)
		var mu sync.Mutex
		var wg sync.WaitGroup
		tick := time.NewTicker(every)
		for i := 0; i < arrivals && sctx.Err() == nil; i++ {
			if i > 0 {
				select {
				case <-tick.C:
				case <-sctx.Done():
				}
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				var d sample
				err := contextRun(fork, &d)()
				mu.Lock()
				defer mu.Unlock()
				ctxRate = append(ctxRate, d...)
				if err != nil && rateErr == nil {
					rateErr = err
				}
			}()
		}
		tick.Stop()
		wg.Wait()
		if rateErr != nil {
			return rateErr
		}
		if err := waitNoKernels(sctx, fork.pid()); err != nil {
			return err
		}
	}

	// Idle kernels' memory.
	idle := 10
	if len(o.density) > 0 && o.density[len(o.density)-1] < idle {
		idle = o.density[len(o.density)-1]
	}
	pss := map[*server]launcherPSS{}
	for _, s := range []*server{fork, exec} {
		progress("launcher: %d idle python3 kernels in %s", idle, s.name)
		ids := make([]string, idle)
		if err := parallel(idle, 2, func(i int) error {
			return b.retry(func() error {
				var err error
				ids[i], err = s.startKernel(sctx, "python3")
				return err
			})
		}); err != nil {
			return err
		}
		time.Sleep(densitySettle)
		p, err := kernelsPSS(s.pid())
		if err != nil {
			return err
		}
		pss[s] = p
		for _, id := range ids {
			if id != "" {
				s.deleteKernel(sctx, id)
			}
		}
	}
	pf, pe := pss[fork], pss[exec]
	b.add(row{figure: "Context → first result, python3, pool empty: forked from a zygote (kernelgate) against exec'd (direct column: kernelgate --python-launcher exec)",
		kg: lat(ctxFork), direct: lat(ctxExec), ratios: ratios(ctxFork, ctxExec, nil, true)})
	b.add(row{figure: "Context → first result, python3, pool empty, new contexts arriving at 10 a second (50, each deleted after its result): forked",
		kg: lat(ctxRate)})
	b.add(row{figure: "Isolated run on a pool miss, python3 (POST /api/execute `1+1`, isolated, --pool-size 0): forked against exec'd",
		kg: lat(isoFork), direct: lat(isoExec), ratios: ratios(isoFork, isoExec, nil, true)})
	b.add(row{figure: fmt.Sprintf("PSS of an idle python3 kernel (all its processes; mean of %d, zygote preloading %s): forked, and with its share of the zygote, against exec'd", idle, strings.Join(launcherPreload, ", ")),
		kg:     fmt.Sprintf("%.1f MiB; %.1f MiB with 1/%d of the zygote's %.1f MiB", mib(pf.perKernel), mib(pf.perKernel+pf.zygote/int64(idle)), idle, mib(pf.zygote)),
		direct: fmt.Sprintf("%.1f MiB", mib(pe.perKernel)),
		ratios: "fork/exec " + ratio(float64(pf.perKernel), float64(pe.perKernel)) + "; with zygote share " + ratio(float64(pf.perKernel+pf.zygote/int64(idle)), float64(pe.perKernel))})
	b.check("new Python context → first result ≤ 80 ms p50, ≤ 150 ms p90 with the pool empty (forked)",
		len(ctxFork) > 0 && ctxFork.p50() <= 80*time.Millisecond && ctxFork.p90() <= 150*time.Millisecond,
		"%s ms p50, %s ms p90", fmtMS(ctxFork.p50()), fmtMS(ctxFork.p90()))
	b.missedBecause(whyKernelInit)
	b.check("new Python contexts at 10 a second → first result ≤ 80 ms p50, ≤ 150 ms p90 (forked, pool empty)",
		len(ctxRate) > 0 && ctxRate.p50() <= 80*time.Millisecond && ctxRate.p90() <= 150*time.Millisecond,
		"%s ms p50, %s ms p90", fmtMS(ctxRate.p50()), fmtMS(ctxRate.p90()))
	b.missedBecause(fmt.Sprintf("the starts share the machine's cores: p50 %s ms at 10 a second against %s ms for a start alone, each start being one core busy for most of its time; ",
		fmtMS(ctxRate.p50()), fmtMS(ctxFork.p50())) + whyKernelInit)
	b.check("isolated Python run on a pool miss ≤ 100 ms p50 (forked)", len(isoFork) > 0 && isoFork.p50() <= 100*time.Millisecond,
		"%s ms p50", fmtMS(isoFork.p50()))
	b.missedBecause(whyKernelInit)
	b.check("idle Python kernel PSS ≤ 40 % of an exec'd one (forked, with its share of the zygote)",
		pf.perKernel+pf.zygote/int64(idle) <= pe.perKernel*40/100,
		"%.1f MiB against %.1f MiB", mib(pf.perKernel+pf.zygote/int64(idle)), mib(pe.perKernel))
	b.missedBecause("a kernel's start writes reference counts all over the zygote's pages, which copies them (CPython 3.11 has no immortal objects), and the zygote's parked spare holds the copies its next kernel will make; see \"Python kernels forked from a zygote\"")
	return nil
}

// whyKernelInit is why a forked Python kernel's start is not faster: what
// is left is the per-instance work of ipykernel and IPython.
const whyKernelInit = "what is left of a forked start is ipykernel's and IPython's per-instance initialisation (traitlets configuration, the shell and its magics, five ZeroMQ sockets and their threads, the first cell): most of a forked start's time (about 120 ms of 150 ms on the slower machine of the runs of 2026-12-05), one core's CPU all along, and not shareable between kernels without changing their code; see \"Python kernels forked from a zygote\""

// launcherSpecs copies the kernelspecs into a temporary directory with the
// python3 kernelspec's preload list set.
func launcherSpecs() (string, error) {
	dir, err := os.MkdirTemp("", "kgbench-specs-")
	if err != nil {
		return "", err
	}
	entries, err := os.ReadDir(specDir)
	if err != nil {
		return dir, err
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		os.Mkdir(filepath.Join(dir, e.Name()), 0o755)
		files, _ := os.ReadDir(filepath.Join(specDir, e.Name()))
		for _, f := range files {
			b, err := os.ReadFile(filepath.Join(specDir, e.Name(), f.Name()))
			if err != nil {
				return dir, err
			}
			if e.Name() == "python3" && f.Name() == "kernel.json" {
				var spec map[string]any
				if err := json.Unmarshal(b, &spec); err != nil {
					return dir, err
				}
				md, _ := spec["metadata"].(map[string]any)
				if md == nil {
					md = map[string]any{}
				}
				md["kernelgate"] = map[string]any{"preload": launcherPreload}
				spec["metadata"] = md
				b, _ = json.Marshal(spec)
			}
			if err := os.WriteFile(filepath.Join(dir, e.Name(), f.Name()), b, 0o644); err != nil {
				return dir, err
			}
		}
	}
	return dir, nil
}

// launcherPSS is the memory of a gateway's idle kernels.
type launcherPSS struct {
	perKernel int64 // mean PSS of a kernel's processes
	zygote    int64 // PSS of the zygotes (0 when exec'd)
}

// kernelsPSS reads the PSS of the gateway's kernels (its children but the
// zygotes, with their descendants) and of its zygotes.
func kernelsPSS(gateway int) (launcherPSS, error) {
	var out launcherPSS
	kids := childrenOf(gateway)
	n := 0
	for _, pid := range kids {
		total := int64(0)
		for _, p := range append([]int{pid}, descendants(pid)...) {
			v, err := pssOf(p)
			if err != nil {
				return out, err
			}
			total += v
		}
		if isZygote(pid) {
			out.zygote += total
			continue
		}
		out.perKernel += total
		n++
	}
	if n == 0 {
		return out, fmt.Errorf("no kernels under pid %d", gateway)
	}
	out.perKernel /= int64(n)
	return out, nil
}

// waitNoKernels waits until the gateway pid has no child but its zygotes.
func waitNoKernels(ctx context.Context, gateway int) error {
	for {
		n := 0
		for _, c := range childrenOf(gateway) {
			if !isZygote(c) {
				n++
			}
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d kernel processes still run under %d: %w", n, gateway, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func childrenOf(pid int) []int {
	var out []int
	procs, _ := procfs.AllProcs()
	for _, p := range procs {
		if st, err := p.Stat(); err == nil && st.PPID == pid {
			out = append(out, p.PID)
		}
	}
	return out
}

func descendants(pid int) []int {
	var out []int
	for _, c := range childrenOf(pid) {
		out = append(out, c)
		out = append(out, descendants(c)...)
	}
	return out
}

func isZygote(pid int) bool {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	for _, a := range strings.Split(string(b), "\x00") {
		if a == "kernelgate-zygote" {
			return true
		}
	}
	return false
}

// pssOf reads Pss from /proc/pid/smaps_rollup, in bytes.
func pssOf(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Pss:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no Pss in /proc/%d/smaps_rollup", pid)
}

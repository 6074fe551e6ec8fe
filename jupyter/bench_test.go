//go:build linux

package jupyter_test

// Benchmarks of the kernel client against internal/directclient, a minimal
// client on zmq4's sockets (package jupyter has its own sockets over zmq4's
// connections, with raw reads and writes). Each benchmark
// makes a fixed number of measurements, interleaving the two clients
// (A B A B …) so that drift of a shared, noisy machine hits both alike, and
// reports nearest-rank percentiles. Run with
//
//	go test ./jupyter -run '^$' -bench . -benchtime 1x -timeout 20m
//
// (make bench). A larger -benchtime Nx repeats the fixed counts N times and
// pools the samples.

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/directclient"
	"kernelgate/internal/testkernels"
	"kernelgate/jupyter"
	"kernelgate/provision/local"
)

const (
	benchStarts     = 9   // start → ready measurements per client and kernel
	benchRoundTrips = 300 // 1+1 round trips per client and kernel
	benchWarmup     = 20  // unmeasured round trips per client first
	benchIdle       = 5 * time.Second
)

var benchKernels = []string{"python3", "deno"}

// BenchmarkStartToReady measures spawn → ready (kernel_info reply and an
// iopub message received) for jupyter.Start and the direct client, one
// start and close of each per iteration.
func BenchmarkStartToReady(b *testing.B) {
	for _, name := range benchKernels {
		b.Run(name, func(b *testing.B) {
			spec := testkernels.Spec(b, name)
			prov := &local.Provisioner{RuntimeDir: b.TempDir()}
			kgStart := func() (start, stop time.Duration) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				t0 := time.Now()
				k, err := jupyter.Start(ctx, prov, jupyter.Config{Spec: spec})
				start = time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				k.Shutdown(ctx)
				return start, time.Since(t1)
			}
			dcStart := func() (start, stop time.Duration) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				t0 := time.Now()
				c, err := directclient.Start(ctx, spec)
				start = time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				c.Close()
				return start, time.Since(t1)
			}
			kgStart() // warm the page cache and both code paths
			dcStart()
			var kg, dc, kgStop, dcStop []time.Duration
			for range b.N {
				for range benchStarts {
					s, t := kgStart()
					kg, kgStop = append(kg, s), append(kgStop, t)
					s, t = dcStart()
					dc, dcStop = append(dc, s), append(dcStop, t)
				}
			}
			k, d, paired := report(b, kg, dc)
			b.ReportMetric(ratio(k.p50, d.p50), "ratio-p50")
			ks, ds := summarize(kgStop), summarize(dcStop)
			b.Logf("%s, %d starts each, interleaved; p50 / p90 in ms\n"+
				"  %-16s %-18s %-18s %s\n"+
				"  %-16s %-18s %-18s %+.1f ms, ratio %.3f; paired %+.1f ms\n"+
				"  %-16s %-18s %-18s %+.1f ms",
				name, len(kg),
				"", "kernelgate", "direct", "difference of p50",
				"start → ready", k, d, ms(k.p50-d.p50), ratio(k.p50, d.p50), ms(paired),
				"shutdown", ks, ds, ms(ks.p50-ds.p50))
		})
	}
}

// BenchmarkExecuteRoundTrip measures `1+1` from send to both execute_reply
// and status: idle, on one warm kernel per client, alternating the clients
// request by request.
func BenchmarkExecuteRoundTrip(b *testing.B) {
	for _, name := range benchKernels {
		b.Run(name, func(b *testing.B) {
			spec := testkernels.Spec(b, name)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			k, err := jupyter.Start(ctx, &local.Provisioner{RuntimeDir: b.TempDir()}, jupyter.Config{Spec: spec})
			if err != nil {
				b.Fatal(err)
			}
			defer k.Shutdown(context.Background())
			c, err := directclient.Start(ctx, spec)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			kgRun := func() time.Duration {
				t0 := time.Now()
				reply, err := k.Execute(ctx, "1+1", nil)
				d := time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				if reply.Type() != jupyter.ExecuteReply {
					b.Fatalf("got %s, want execute_reply", reply.Type())
				}
				return d
			}
			dcRun := func() time.Duration {
				t0 := time.Now()
				status, err := c.Execute(ctx, "1+1")
				d := time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				if status != "ok" {
					b.Fatalf("status %q, want ok", status)
				}
				return d
			}
			for range benchWarmup {
				kgRun()
				dcRun()
			}
			var kg, dc []time.Duration
			for range b.N {
				for range benchRoundTrips {
					kg = append(kg, kgRun())
					dc = append(dc, dcRun())
				}
			}
			ks, ds, paired := report(b, kg, dc)
			b.ReportMetric(ms(ks.p50-ds.p50), "diff-ms-p50")
			b.ReportMetric(ms(ks.p90-ds.p90), "diff-ms-p90")
			b.Logf("%s, %d round trips each, interleaved; p50 / p90 in ms\n"+
				"  %-16s %-18s %-18s %s\n"+
				"  %-16s %-18s %-18s %+.3f ms (p90 %+.3f ms); paired %+.3f ms",
				name, len(kg),
				"", "kernelgate", "direct", "difference of p50",
				"1+1 → idle", ks, ds, ms(ks.p50-ds.p50), ms(ks.p90-ds.p90), ms(paired))
		})
	}
}

// BenchmarkIdleCPU measures the CPU time and context switches of this
// process over 5 s with no kernel, then over 5 s with one idle python3
// kernel started by jupyter.Start (after one execute); each window starts
// after 1 s of settling. The kernel process's own CPU time is reported too.
func BenchmarkIdleCPU(b *testing.B) {
	spec := testkernels.Spec(b, "python3")
	var base, withKernel idleUsage
	var kernel time.Duration
	for range b.N {
		base = base.max(measureIdle(benchIdle))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		k, err := jupyter.Start(ctx, &local.Provisioner{RuntimeDir: b.TempDir()}, jupyter.Config{Spec: spec})
		if err != nil {
			cancel()
			b.Fatal(err)
		}
		if _, err := k.Execute(ctx, "1+1", nil); err != nil {
			b.Fatal(err)
		}
		k0 := procCPU(b, k.PID())
		withKernel = withKernel.max(measureIdle(benchIdle))
		kernel = max(kernel, procCPU(b, k.PID())-k0)
		k.Shutdown(ctx)
		cancel()
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ms(withKernel.cpu), "cpu-ms")
	b.ReportMetric(float64(withKernel.switches), "ctx-switches")
	b.ReportMetric(ms(base.cpu), "no-kernel-cpu-ms")
	b.ReportMetric(float64(base.switches), "no-kernel-ctx-switches")
	b.ReportMetric(ms(kernel), "kernel-cpu-ms")
	b.Logf("over %v idle (worst of %d): this process %.3f ms CPU and %d context switches with one python3 kernel, "+
		"%.3f ms and %d with none; the kernel process %.0f ms CPU",
		benchIdle, b.N, ms(withKernel.cpu), withKernel.switches, ms(base.cpu), base.switches, ms(kernel))
}

// idleUsage is what this process used over a window.
type idleUsage struct {
	cpu      time.Duration // user + system
	switches int64         // voluntary and involuntary context switches
}

func (u idleUsage) max(v idleUsage) idleUsage {
	return idleUsage{cpu: max(u.cpu, v.cpu), switches: max(u.switches, v.switches)}
}

// idleSettle is how long measureIdle lets the process come to rest before
// its window: after activity the Go runtime's monitor thread polls every
// 20 µs and backs off to 10 ms before it parks, which takes about 0.1 s.
const idleSettle = time.Second

// measureIdle returns what this process used while sleeping for d. It
// first makes the runtime collect and return freed memory and lets the
// process settle, so that the window shows the steady state rather than
// the runtime tidying up after the work that came before.
func measureIdle(d time.Duration) idleUsage {
	debug.FreeOSMemory()
	time.Sleep(idleSettle)
	var r0, r1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	time.Sleep(d)
	syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	cpu := func(r *syscall.Rusage) int64 { return r.Utime.Nano() + r.Stime.Nano() }
	return idleUsage{
		cpu:      time.Duration(cpu(&r1) - cpu(&r0)),
		switches: r1.Nvcsw + r1.Nivcsw - r0.Nvcsw - r0.Nivcsw,
	}
}

// procCPU returns utime+stime of pid from /proc, in clock ticks of 10 ms.
func procCPU(b *testing.B, pid int) time.Duration {
	s, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// pid (comm) state ppid … utime is field 14, stime 15.
	f := strings.Fields(string(s[strings.LastIndexByte(string(s), ')')+1:]))
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// stats are nearest-rank percentiles of a sample.
type stats struct{ p50, p90 time.Duration }

func summarize(ds []time.Duration) stats {
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p/100*float64(len(s)))) - 1
		return s[max(i, 0)]
	}
	return stats{p50: rank(50), p90: rank(90)}
}

func (s stats) String() string {
	if s.p50 < 10*time.Millisecond {
		return fmt.Sprintf("%.3f / %.3f", ms(s.p50), ms(s.p90))
	}
	return fmt.Sprintf("%.1f / %.1f", ms(s.p50), ms(s.p90))
}

// report sets the benchmark's metrics from the samples of both clients,
// taken in pairs: kg[i] right before dc[i]. It returns their percentiles
// and the median of the paired differences kg[i] - dc[i], which slow drift
// of the machine's load affects less than the difference of the medians.
func report(b *testing.B, kg, dc []time.Duration) (k, d stats, paired time.Duration) {
	k, d = summarize(kg), summarize(dc)
	diffs := make([]time.Duration, len(kg))
	for i := range kg {
		diffs[i] = kg[i] - dc[i]
	}
	paired = summarize(diffs).p50
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(len(kg)), "runs")
	b.ReportMetric(ms(k.p50), "kernelgate-ms-p50")
	b.ReportMetric(ms(k.p90), "kernelgate-ms-p90")
	b.ReportMetric(ms(d.p50), "direct-ms-p50")
	b.ReportMetric(ms(d.p90), "direct-ms-p90")
	b.ReportMetric(ms(paired), "paired-diff-ms-p50")
	return k, d, paired
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

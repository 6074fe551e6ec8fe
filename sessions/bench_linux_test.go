package sessions

import (
	"context"
	"syscall"
	"testing"
	"time"
)

// BenchmarkExecuteInContext is what the manager spends on one run waited
// for (POST /api/execute) in a context, on a fake kernel, with the state
// store off and on: cpu-µs/run is this process's CPU time per run (the
// fake kernel's included, the same in both), in a steady state where
// every new run prunes the oldest of the runs kept.
func BenchmarkExecuteInContext(b *testing.B) {
	for _, withStore := range []bool{false, true} {
		name := "store=off"
		if withStore {
			name = "store=on"
		}
		b.Run(name, func(b *testing.B) {
			cfg := Config{RunsKept: 1000}
			if withStore {
				store := openStore(b, b.TempDir())
				b.Cleanup(func() { store.Close() })
				cfg.Store = store
			}
			m := newFakeManager(b, cfg, &fakeKernels{})
			ctx := context.Background()
			c, err := m.CreateContext(ctx, ContextRequest{Language: "python"})
			if err != nil {
				b.Fatal(err)
			}
			run := func(code string) {
				r, err := m.Execute(ctx, ExecuteRequest{Code: code, Context: c.ID, Wait: true})
				if err != nil {
					b.Fatal(err)
				}
				if err := r.Wait(ctx); err != nil {
					b.Fatal(err)
				}
				r.ExecutionJSON()
			}
			run("x = 2")
			for range 1200 { // past RunsKept: each run prunes one
				run("x") // an execute_result of 2
			}
			b.ResetTimer()
			c0 := cpuNow()
			for range b.N {
				run("x")
			}
			b.ReportMetric(float64((cpuNow()-c0).Microseconds())/float64(b.N), "cpu-µs/run")
		})
	}
}

func cpuNow() time.Duration {
	var r syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r)
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}

//go:build linux

package main

import (
	"context"
	"fmt"
	"time"

	"kernelgate/internal/directclient"
)

// settleAfterStart lets a kernel that just became ready (and the machine)
// come to rest before a measurement that should not include its start.
const settleAfterStart = 300 * time.Millisecond

// benchPool measures an isolated `1+1` (POST /api/execute with isolated:
// true) served from the warm pool, each run after the pool has refilled,
// against the direct client's first `1+1` on a kernel that has just
// become ready: the work a pooled run cannot avoid. The pool-off figures
// come from the start section.
func (b *bench) benchPool(ctx context.Context) error {
	for _, k := range kernels {
		spec, _ := b.specs.Get(k.spec)
		var kg, kgB, direct sample
		missing, missingB := 0, 0
		pooled := func(s *server, out *sample, missing *int) error {
			sctx, cancel := within(ctx, 2*time.Minute)
			defer cancel()
			before, err := s.kernelCount(sctx)
			if err != nil {
				return err
			}
			if err := b.quiet(sctx, k.spec); err != nil {
				return err
			}
			d, err := measure(func() error {
				m, err := s.execute(sctx, map[string]any{"code": "1+1", "language": k.language, "isolated": true}, "2")
				if m {
					*missing++
				}
				return err
			})
			if err != nil {
				return err
			}
			*out = append(*out, d)
			return s.waitKernels(sctx, before)
		}
		steps := []func() error{func() error { return pooled(b.kg, &kg, &missing) }}
		if b.kgB != nil {
			steps = append(steps, func() error { return pooled(b.kgB, &kgB, &missingB) })
		}
		first := func() error {
			sctx, cancel := within(ctx, 2*time.Minute)
			defer cancel()
			c, err := directclient.Start(sctx, spec)
			if err != nil {
				return err
			}
			defer c.Close()
			if err := b.quiet(sctx, k.spec); err != nil {
				return err
			}
			var status string
			d, err := measure(func() error {
				var err error
				status, err = c.Execute(sctx, "1+1")
				return err
			})
			if err != nil {
				return err
			}
			if status != "ok" {
				return fmt.Errorf("direct: status %s", status)
			}
			direct = append(direct, d)
			return nil
		}
		steps = append(steps, first)
		reset := func() { kg, kgB, direct, missing, missingB = nil, nil, nil, 0, 0 }
		if err := b.interleave("isolated run from the warm pool, "+k.spec, steps, reset, b.opt.poolRuns); err != nil {
			return err
		}
		b.add(row{figure: "Isolated `1+1` from the warm pool, " + k.spec + " (direct: first `1+1` on a ready kernel)",
			kg: lat(kg) + missingNote(missing), direct: lat(direct), ratios: ratios(kg, direct, nil, true)})
		if b.kgB != nil {
			b.add(row{figure: "Isolated `1+1` from the warm pool, " + k.spec + ", kernelgate B",
				kg: lat(kgB) + missingNote(missingB), direct: lat(direct),
				ratios: ratios(kgB, direct, nil, true) + "; B/A " + ratio(ms(kgB.p50()), ms(kg.p50()))})
		}
		if f := starts[k.spec]; f != nil {
			b.add(row{figure: "Isolated `1+1` with the pool off, " + k.spec + " (direct: spawn → first `1+1` done)",
				kg: lat(f.kgIsolated) + missingNote(f.missingIsolated), direct: lat(f.directFirst), ratios: ratios(f.kgIsolated, f.directFirst, nil, true)})
		}
		b.check("isolated `1+1` from the warm pool on "+k.spec+" p50 ≤ 30 ms", kg.p50() <= 30*time.Millisecond,
			"p50 %s ms, p90 %s ms", fmtMS(kg.p50()), fmtMS(kg.p90()))
	}
	return nil
}

// quiet waits until the warm pools of spec in every kernelgate are full
// (a kernel starting elsewhere burns a core and would slow the run being
// measured), then lets the machine settle.
func (b *bench) quiet(ctx context.Context, spec string) error {
	for _, s := range []*server{b.kg, b.kgB} {
		if s == nil {
			continue
		}
		if err := s.waitPool(ctx, spec, 1); err != nil {
			return err
		}
	}
	time.Sleep(settleAfterStart)
	return nil
}

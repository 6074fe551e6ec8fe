//go:build linux

package main

import (
	"context"
	"fmt"
	"time"

	"kernelgate/internal/directclient"
)

// startFigures are the samples of the start section, kept for the pool
// section's rows.
type startFigures struct {
	direct, directFirst, kg, kgContext, kgIsolated, js sample
	// runs that completed without their result (Deno, late output)
	missingContext, missingIsolated int
}

var starts = map[string]*startFigures{}

// benchStart measures, per kernel and interleaved:
//   - direct: spawn → ready (kernel_info reply and an iopub message), and
//     spawn → the first 1+1 done;
//   - kernelgate: POST /api/kernels → kernel_info_reply over a v1
//     websocket; POST /api/contexts → the result of POST /api/execute in
//     it, and an isolated run (POST /api/execute → result), both with the
//     pool off (the warm section measures contexts from the pool);
//   - Jupyter Server: POST /api/kernels → kernel_info_reply over its
//     websocket (it answers the POST before the kernel is ready).
func (b *bench) benchStart(ctx context.Context) error {
	for _, k := range kernels {
		spec, _ := b.specs.Get(k.spec)
		f := &startFigures{}
		starts[k.spec] = f
		direct := func() error {
			sctx, cancel := within(ctx, 2*time.Minute)
			defer cancel()
			t0 := time.Now()
			c, err := directclient.Start(sctx, spec)
			if err != nil {
				return err
			}
			defer c.Close()
			ready := time.Since(t0)
			status, err := c.Execute(sctx, "1+1")
			first := time.Since(t0)
			if err != nil {
				return err
			}
			if status != "ok" {
				return fmt.Errorf("direct: status %s", status)
			}
			f.direct, f.directFirst = append(f.direct, ready), append(f.directFirst, first)
			return nil
		}
		viaWS := func(s *server, v1 bool, out *sample) error {
			d, err := startToReady(ctx, s, k.spec, v1)
			if err == nil {
				*out = append(*out, d)
			}
			return err
		}
		contextRun := func() error {
			sctx, cancel := within(ctx, 2*time.Minute)
			defer cancel()
			var id string
			d, err := measure(func() error {
				var err error
				if id, _, err = b.kgOff.createContext(sctx, k.language); err != nil {
					return err
				}
				missing, err := b.kgOff.execute(sctx, map[string]any{"code": "1+1", "context": id}, "2")
				if missing {
					f.missingContext++
				}
				return err
			})
			if id != "" {
				if derr := b.kgOff.deleteContext(sctx, id); err == nil {
					err = derr
				}
			}
			if err == nil {
				f.kgContext = append(f.kgContext, d)
			}
			return err
		}
		isolated := func() error {
			sctx, cancel := within(ctx, 2*time.Minute)
			defer cancel()
			before, err := b.kgOff.kernelCount(sctx)
			if err != nil {
				return err
			}
			d, err := measure(func() error {
				missing, err := b.kgOff.execute(sctx, map[string]any{"code": "1+1", "language": k.language, "isolated": true}, "2")
				if missing {
					f.missingIsolated++
				}
				return err
			})
			if err != nil {
				return err
			}
			f.kgIsolated = append(f.kgIsolated, d)
			// The kernel is deleted after the run: let that finish first.
			return b.kgOff.waitKernels(sctx, before)
		}
		steps := []func() error{
			direct,
			func() error { return viaWS(b.kg, true, &f.kg) },
			contextRun,
			isolated,
			func() error { return viaWS(b.js, false, &f.js) },
		}
		if err := b.interleave("start → ready, "+k.spec, steps, func() { *f = startFigures{} }, b.opt.starts); err != nil {
			return err
		}
		b.add(row{figure: "Start → ready, " + k.spec + " (kernelgate and Jupyter Server: POST /api/kernels → kernel_info_reply over the websocket)",
			kg: lat(f.kg), direct: lat(f.direct), js: lat(f.js), ratios: ratios(f.kg, f.direct, f.js, true)})
		b.add(row{figure: "Context → first result, " + k.spec + " (POST /api/contexts, then POST /api/execute `1+1` in it, pool off; direct: spawn → first `1+1` done)",
			kg: lat(f.kgContext) + missingNote(f.missingContext), direct: lat(f.directFirst), ratios: ratios(f.kgContext, f.directFirst, nil, true)})
	}
	return nil
}

// kernelCount is the number of kernels the gateway lists.
func (s *server) kernelCount(ctx context.Context) (int, error) {
	var ks []struct{}
	err := s.expect(ctx, 200, "GET", "api/kernels", nil, &ks)
	return len(ks), err
}

// waitKernels waits until the gateway lists at most n kernels.
func (s *server) waitKernels(ctx context.Context, n int) error {
	for {
		c, err := s.kernelCount(ctx)
		if err != nil {
			return err
		}
		if c <= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %d kernels still listed: %w", s.name, c, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// interleave runs steps once as a warm-up, then reset to forget what the
// warm-up measured, then the steps in turn n times, each retried once.
func (b *bench) interleave(what string, steps []func() error, reset func(), n int) error {
	progress("%s: warming up", what)
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	reset()
	for i := range n {
		progress("%s: %d/%d", what, i+1, n)
		for _, s := range steps {
			if err := b.retry(s); err != nil {
				return err
			}
		}
	}
	return nil
}

// retry runs a step, once more after a failure: a kernel start can fail
// when a port its launcher found free (Jupyter's connection files name
// ports the kernel binds later) is taken by another kernel in the
// meantime. Failures are counted and reported.
func (b *bench) retry(step func() error) error {
	err := step()
	if err == nil {
		return nil
	}
	b.failures.Add(1)
	progress("a step failed, trying once more: %v", err)
	return step()
}

// startToReady starts a kernel of spec on s, times it until its websocket
// answers kernel_info, and deletes it.
func startToReady(ctx context.Context, s *server, spec string, v1 bool) (time.Duration, error) {
	sctx, cancel := within(ctx, 2*time.Minute)
	defer cancel()
	var id string
	d, err := measure(func() error {
		var err error
		if id, err = s.startKernel(sctx, spec); err != nil {
			return err
		}
		ws, err := dialKernel(sctx, s, id, v1)
		if err != nil {
			return err
		}
		defer ws.Close()
		return ws.kernelInfo(sctx)
	})
	if id != "" {
		if derr := s.deleteKernel(sctx, id); err == nil {
			err = derr
		}
	}
	return d, err
}

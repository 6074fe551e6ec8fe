//go:build linux

package main

import (
	"context"
	"fmt"
	"time"

	"kernelgate/internal/directclient"
)

// streamCode prints n lines of 1 MiB (newline included), each flushed, so
// the kernel publishes about one stream message per line.
func streamCode(language string, n int) string {
	if language == "python" {
		return fmt.Sprintf("_l = 'x' * (1024 * 1024 - 1)\nfor _i in range(%d):\n    print(_l, flush=True)\ndel _l, _i", n)
	}
	return fmt.Sprintf("{ const l = 'x'.repeat(1024 * 1024 - 1); for (let i = 0; i < %d; i++) console.log(l); }", n)
}

// benchStream measures a run printing streamMiB MiB, until its reply and
// idle have arrived (and, through kernelgate's websocket, every byte): the
// direct client against kernelgate's v1 websocket, interleaved, with the
// gateway's peak RSS (VmHWM, reset before the runs).
func (b *bench) benchStream(ctx context.Context) error {
	for _, k := range kernels {
		spec, _ := b.specs.Get(k.spec)
		sctx, cancel := within(ctx, 10*time.Minute)
		code := streamCode(k.language, b.opt.streamMiB)
		total := b.opt.streamMiB << 20
		err := func() error {
			var dc *directclient.Client
			if err := b.retry(func() error {
				var err error
				dc, err = directclient.Start(sctx, spec)
				return err
			}); err != nil {
				return err
			}
			defer dc.Close()
			var direct sample
			// CPU of the direct client (this process) and of its kernel.
			var directCPU, kernelCPU time.Duration
			runs := []func() error{func() error {
				c0, k0 := selfCPU(), cpuOf(dc.PID())
				d, err := measure(func() error {
					status, err := dc.Execute(sctx, code)
					if err == nil && status != "ok" {
						err = fmt.Errorf("direct: status %s", status)
					}
					return err
				})
				directCPU += selfCPU() - c0
				kernelCPU += cpuOf(dc.PID()) - k0
				direct = append(direct, d)
				return err
			}}
			type via struct {
				s    *server
				lat  sample
				late int
				rss0 int64
				// CPU of the gateway and of the harness's websocket client
				cpu, client time.Duration
			}
			var gws []*via
			for _, s := range []*server{b.kg, b.kgB} {
				if s == nil {
					continue
				}
				g := &via{s: s}
				gws = append(gws, g)
				var id string
				if err := b.retry(func() error {
					var err error
					id, err = s.startKernel(sctx, k.spec)
					return err
				}); err != nil {
					return err
				}
				defer s.deleteKernel(context.Background(), id)
				ws, err := dialKernel(sctx, s, id, true)
				if err != nil {
					return err
				}
				defer ws.Close()
				if err := ws.kernelInfo(sctx); err != nil {
					return err
				}
				runs = append(runs, func() error {
					var o outcome
					g0, c0 := cpuOf(s.pid()), selfCPU()
					d, err := measure(func() error {
						var err error
						o, err = ws.execute(sctx, code, total)
						return err
					})
					g.cpu += cpuOf(s.pid()) - g0
					g.client += selfCPU() - c0
					if err == nil && o.status != "ok" {
						err = fmt.Errorf("%s: status %s", s.name, o.status)
					}
					if o.lateBytes > 0 {
						g.late++
					}
					g.lat = append(g.lat, d)
					return err
				})
			}
			progress("streaming %d MiB, %s: warming up", b.opt.streamMiB, k.spec)
			for _, r := range runs {
				if err := r(); err != nil {
					return err
				}
			}
			direct, directCPU, kernelCPU = nil, 0, 0
			for _, g := range gws {
				g.lat, g.late, g.cpu, g.client = nil, 0, 0, 0
				if err := resetPeak(g.s.pid()); err != nil {
					return fmt.Errorf("resetting the gateway's peak RSS: %w", err)
				}
				g.rss0, _, _ = memStatus(g.s.pid())
			}
			for i := range b.opt.streamRuns {
				progress("streaming %d MiB, %s: %d/%d", b.opt.streamMiB, k.spec, i+1, b.opt.streamRuns)
				for _, r := range runs {
					if err := r(); err != nil {
						return err
					}
				}
			}
			rate := func(s sample) string {
				return fmt.Sprintf("%.0f MiB/s (%s / %s s, n=%d)", float64(b.opt.streamMiB)/s.p50().Seconds(),
					secs(s.p50()), secs(s.p90()), len(s))
			}
			perMiB := func(d time.Duration, runs int) string {
				return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000/float64(runs*b.opt.streamMiB))
			}
			for i, g := range gws {
				_, hwm, _ := memStatus(g.s.pid())
				note := ""
				if g.late > 0 {
					note = fmt.Sprintf("; %d of %d runs had output after idle", g.late, len(g.lat))
				}
				if i > 0 {
					note += "; B/A throughput " + ratio(gws[0].lat.p50().Seconds(), g.lat.p50().Seconds())
				}
				suffix := ""
				if g.s == b.kgB {
					suffix = ", kernelgate B"
				}
				b.add(row{figure: fmt.Sprintf("%d MiB of output in 1 MiB lines, %s (kernelgate: v1 websocket)%s", b.opt.streamMiB, k.spec, suffix),
					kg: rate(g.lat), direct: rate(direct),
					ratios: "kg/direct throughput " + ratio(direct.p50().Seconds(), g.lat.p50().Seconds()) + note})
				if i == 0 && k.spec == "python3" {
					b.check(fmt.Sprintf("%d MiB of output, python3, v1 websocket: ≥ 0.9× the direct client's throughput", b.opt.streamMiB),
						g.lat.p50() <= time.Duration(float64(direct.p50())/0.9),
						"%s", ratio(direct.p50().Seconds(), g.lat.p50().Seconds()))
				}
				b.add(row{figure: "CPU per MiB streamed, " + k.spec + suffix + " (kernelgate: the gateway process; direct: the client; harness's websocket client and direct's kernel in the ratios)",
					kg: perMiB(g.cpu, len(g.lat)), direct: perMiB(directCPU, len(direct)),
					ratios: "websocket client " + perMiB(g.client, len(g.lat)) + "; direct's kernel " + perMiB(kernelCPU, len(direct))})
				b.add(row{figure: "Gateway peak RSS while streaming, " + k.spec + suffix,
					kg: fmt.Sprintf("%.0f MiB (%.0f MiB before)", mib(hwm), mib(g.rss0))})
			}
			return nil
		}()
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2f", d.Seconds()) }

// cpuOf is cpuTime, 0 when it cannot be read.
func cpuOf(pid int) time.Duration {
	d, _ := cpuTime(pid)
	return d
}

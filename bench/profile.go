//go:build linux

package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"time"

	"kernelgate/gateway"
	"kernelgate/kernelspecs"
	"kernelgate/provision/local"
	"kernelgate/runs"
	"kernelgate/sessions"
	"kernelgate/state"
)

// The profiling run serves the gateway from this process (kernelgate has
// no pprof endpoint), configured as `kernelgate serve` configures it by
// default (but with no warm pool, so that no kernel starts in the
// background), and records a CPU profile of each workload. The harness's own
// clients run in the same process; their functions are easy to tell apart
// (package main, gorilla's client side).

// inProcessGateway serves kernelgate's gateway on a loopback listener,
// keeping its state in a store of its own, as kernelgate does by default.
func inProcessGateway(poolSize int) (*server, func(), error) {
	dir, err := os.MkdirTemp("", "kgprof-")
	if err != nil {
		return nil, nil, err
	}
	if err := os.Mkdir(filepath.Join(dir, "state"), 0o700); err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	store, err := state.Open(filepath.Join(dir, "state", state.FileName), state.Options{})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	metrics := gateway.NewMetrics()
	mgr := sessions.New(sessions.Config{
		DefaultKernel: "python3", StartTimeout: time.Minute, QueueLimit: 64,
		RunLimits: runs.Limits{LogBytes: 8 << 20, ResultBytes: 32 << 20}, RunRetention: 10 * time.Minute,
		RunsKept: 1000, InterruptGrace: 3 * time.Second, PoolSize: poolSize, LateOutputWait: 20 * time.Millisecond,
		Observer:     metrics,
		KernelLimits: local.Limits{MemoryBytes: 4 << 30, Pids: 1024, NoFile: 4096},
		Store:        store,
	}, kernelspecs.Load([]string{specDir}), &local.Provisioner{RuntimeDir: filepath.Join(dir, "runtime")}, nil)
	s := &server{name: "kernelgate (in process)", token: "bench-profile", dir: dir, http: newHTTPClient(), waited: make(chan struct{})}
	srv := gateway.New(gateway.Config{Token: s.token, Metrics: metrics, MetricsOpen: true}, mgr, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		mgr.Close(context.Background())
		store.Close()
		os.RemoveAll(dir)
		return nil, nil, err
	}
	go srv.Serve(l)
	s.url = "http://" + l.Addr().String() + "/"
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		mgr.Close(ctx)
		store.Close()
		s.http.CloseIdleConnections()
		os.RemoveAll(dir)
	}
	return s, stop, nil
}

// profileWorkloads are what -profile can record, by name.
var profileWorkloads = map[string]func(ctx context.Context, kg *server, n int) error{
	"ws-deno":     func(ctx context.Context, kg *server, n int) error { return profileWS(ctx, kg, "deno", n) },
	"ws-python":   func(ctx context.Context, kg *server, n int) error { return profileWS(ctx, kg, "python3", n) },
	"rest-python": func(ctx context.Context, kg *server, n int) error { return profileREST(ctx, kg, "python", n) },
	"rest-deno":   func(ctx context.Context, kg *server, n int) error { return profileREST(ctx, kg, "javascript", n) },
	// 100 MiB of output in 1 MiB lines over the v1 websocket, n/200 times
	// (10 for the default n).
	"stream-python": func(ctx context.Context, kg *server, n int) error {
		return profileStream(ctx, kg, "python3", "python", n)
	},
	"stream-deno": func(ctx context.Context, kg *server, n int) error {
		return profileStream(ctx, kg, "deno", "javascript", n)
	},
	// The load section's 16 Deno kernels × 4 clients, n executes in all.
	"load-rest": func(ctx context.Context, kg *server, n int) error { return profileLoad(ctx, kg, false, n) },
	"load-ws":   func(ctx context.Context, kg *server, n int) error { return profileLoad(ctx, kg, true, n) },
}

// runProfiles records a CPU profile of each named workload into dir.
func runProfiles(ctx context.Context, dir, names string, n int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	kg, stop, err := inProcessGateway(0)
	if err != nil {
		return err
	}
	defer stop()
	for _, name := range strings.Split(names, ",") {
		fn := profileWorkloads[name]
		if fn == nil {
			return fmt.Errorf("no workload %q to profile", name)
		}
		// Warm up (kernel start, first runs) outside the profile.
		if err := fn(ctx, kg, 20); err != nil {
			return err
		}
		f, err := os.Create(filepath.Join(dir, name+".pprof"))
		if err != nil {
			return err
		}
		progress("profiling %s: %d round trips", name, n)
		t0 := time.Now()
		var tf *os.File
		if traceToo {
			if tf, err = os.Create(filepath.Join(dir, name+".trace")); err != nil {
				f.Close()
				return err
			}
			trace.Start(tf)
		}
		pprof.StartCPUProfile(f)
		err = fn(ctx, kg, n)
		pprof.StopCPUProfile()
		f.Close()
		if tf != nil {
			trace.Stop()
			tf.Close()
		}
		if err != nil {
			return err
		}
		progress("profiled %s in %v: %s", name, time.Since(t0).Round(time.Millisecond), f.Name())
	}
	return nil
}

// traceToo makes -profile write execution traces beside the CPU profiles.
var traceToo bool

// profiled keeps the kernels of the profiled workloads between the
// warm-up and the profile.
var profiled = map[string]*kernelWS{}

// profiledKernel returns the websocket of the kernel of spec kept under
// key, starting it the first time.
func profiledKernel(ctx context.Context, kg *server, key, spec string) (*kernelWS, error) {
	if ws := profiled[key]; ws != nil {
		return ws, nil
	}
	id, err := kg.startKernel(ctx, spec)
	if err != nil {
		return nil, err
	}
	ws, err := dialKernel(ctx, kg, id, true)
	if err != nil {
		return nil, err
	}
	profiled[key] = ws
	return ws, nil
}

func profileWS(ctx context.Context, kg *server, spec string, n int) error {
	ws, err := profiledKernel(ctx, kg, spec, spec)
	if err != nil {
		return err
	}
	for range n {
		o, err := ws.execute(ctx, "1+1", 0)
		if err != nil {
			return err
		}
		if o.wrong("2") {
			return fmt.Errorf("%w: %+v", errWrong, o)
		}
	}
	return nil
}

func profileREST(ctx context.Context, kg *server, language string, n int) error {
	for range n {
		if _, err := kg.execute(ctx, map[string]any{"code": "1+1", "language": language}, "2"); err != nil {
			return err
		}
	}
	return nil
}

func profileStream(ctx context.Context, kg *server, spec, language string, n int) error {
	ws, err := profiledKernel(ctx, kg, "stream "+spec, spec)
	if err != nil {
		return err
	}
	const mib = 100
	runs := max(1, n/200)
	c0, t0 := selfCPU(), time.Now()
	for range runs {
		o, err := ws.execute(ctx, streamCode(language, mib), mib<<20)
		if err != nil {
			return err
		}
		if o.status != "ok" {
			return fmt.Errorf("stream: status %s", o.status)
		}
	}
	progress("stream %s: %.0f MiB/s, %.2f ms of CPU per MiB (gateway and harness)", spec,
		float64(runs*mib)/time.Since(t0).Seconds(), float64((selfCPU()-c0).Microseconds())/1000/float64(runs*mib))
	return nil
}

// profiledLoad keeps the load workloads' contexts and websockets.
var profiledLoad *loadGateway

func profileLoad(ctx context.Context, kg *server, ws bool, n int) error {
	if profiledLoad == nil {
		b := &bench{opt: full}
		g, err := b.setupLoad(ctx, kg, "javascript")
		if err != nil {
			return err
		}
		profiledLoad = g
	}
	wsPhase, restPhase := profiledLoad.phases("kernelgate", max(1, n/len(profiledLoad.rest)))
	p := restPhase
	if ws {
		p = wsPhase
	}
	p.cpu = selfCPU
	if err := p.run(ctx, true); err != nil {
		return err
	}
	if p.res.errs > 0 {
		return fmt.Errorf("load: %d errors, the first: %w", p.res.errs, p.res.first)
	}
	progress("%s: %.0f executes/s, %.2f CPU s per 1 000 (gateway and harness)", p.name, p.res.rate(), p.res.cpu.Seconds()/float64(p.res.total)*1000)
	return nil
}

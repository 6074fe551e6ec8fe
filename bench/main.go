//go:build linux

// Command bench measures kernelgate side by side with a minimal direct
// ZeroMQ client (internal/directclient) on kernels of the same spec, and
// with what users would run instead, Debian's Jupyter Server. It starts
// the real bin/kernelgate and jupyter_server processes, drives them over
// HTTP and websockets from this process, and reads their CPU time and
// memory from /proc.
//
// It prints one table (figure, kernelgate, direct, Jupyter Server,
// ratios) and, with -write, puts it with the machine's description into
// docs/benchmarks.md between the markers there. Progress goes to stderr.
// Run it from the repository root after make build (make bench does both):
//
//	go run ./bench -write docs/benchmarks.md
//
// The systems are interleaved (A B A B …) so that the drift of a shared
// machine's load hits them alike; figures are nearest-rank percentiles.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"kernelgate/kernelspecs"
)

// Paths relative to the repository root, made absolute by main.
var (
	kernelgateBin = "bin/kernelgate"
	specDir       = ".kernels"
)

// options are the sample sizes; -quick divides them for a trial run.
type options struct {
	starts      int // kernel starts per system and kernel
	roundTrips  int // measured 1+1 round trips per system and kernel
	rtKernels   int // kernels each system takes in turn for them
	warmup      int // unmeasured round trips per system first
	poolRuns    int // isolated runs through the warm pool per kernel
	loadKernels int // kernels of the throughput test
	loadClients int // clients per kernel
	loadCount   int // executes per client per round
	loadRounds  int // rounds, each running every system once
	streamRuns  int // runs printing streamMiB per system and kernel
	streamMiB   int
	density     []int // idle kernels for the density figures
	jsDensity   int   // idle kernels of Jupyter Server
	idle        time.Duration
	filesMiB    int // size of the file uploaded and downloaded
	filesRuns   int // uploads and downloads of it
	adopt       int // kept kernels a start re-adopts (state)
	failovers   int // owners SIGKILLed, one a trial (replicas)
}

var full = options{
	starts: 8, roundTrips: 1000, rtKernels: 3, warmup: 20, poolRuns: 12,
	loadKernels: 16, loadClients: 4, loadCount: 25, loadRounds: 2,
	streamRuns: 5, streamMiB: 100,
	density: []int{0, 10, 50}, jsDensity: 10, idle: 30 * time.Second,
	filesMiB: 1024, filesRuns: 3, adopt: 100, failovers: 7,
}

// extraFlags are added to every kernelgate command line (-kgflag).
var extraFlags []string

// compareBin is a second kernelgate program measured beside the first in
// the round trip, pool, stream and load sections (-compare), for the
// before and after of a change; its rows say "kernelgate B".
var compareBin string

// kernels are the kernelspecs measured and the code-interpreter language
// of each.
var kernels = []struct{ spec, language string }{{"python3", "python"}, {"deno", "javascript"}}

// bench holds what the sections share.
type bench struct {
	opt   options
	specs *kernelspecs.Catalog
	kg    *server // kernelgate: warm pool of 1 per kernelspec, default settings
	kgOff *server // kernelgate with --pool-size 0 --late-output-wait=-1ms
	kgB   *server // -compare: another kernelgate program, set up as kg
	js    *server // Jupyter Server
	rows  []row
	goals []goal
	// failures counts measurement steps that failed and were retried
	failures atomic.Int64
	t0       time.Time
}

func main() {
	quick := flag.Bool("quick", false, "small samples, for trying the harness (figures are not meaningful)")
	write := flag.String("write", "", "markdown file whose generated section gets the table (docs/benchmarks.md)")
	only := flag.String("only", "", "comma-separated sections to run: start,roundtrip,pool,stream,load,density,launcher,warm,files,agents,commands,bigoutput,k8s,state,replicas,r (default all)")
	profile := flag.String("profile", "", "instead of the benchmarks, serve the gateway in this process and write CPU profiles of -workloads into this directory")
	workloads := flag.String("workloads", "ws-deno,rest-python,rest-deno", "workloads of -profile: ws-deno, ws-python, rest-python, rest-deno, stream-python, stream-deno, load-rest, load-ws")
	profileN := flag.Int("n", 2000, "round trips per -profile workload")
	flag.BoolVar(&traceToo, "trace", false, "with -profile, also write an execution trace of each workload (go tool trace -pprof=sched shows hand-off latency)")
	flag.StringVar(&compareBin, "compare", "", "a second kernelgate program measured beside bin/kernelgate (rows marked kernelgate B)")
	flag.Func("kgflag", "extra flag for every kernelgate process, e.g. -kgflag=--kernel-memory=0 (repeatable)", func(s string) error {
		extraFlags = append(extraFlags, s)
		return nil
	})
	relay := flag.String("relay", "", "serve as a byte relay to these loopback ports (used by the harness itself)")
	serveFile := flag.String("serve-file", "", "serve this file to every GET on a free loopback port (used by the harness itself)")
	flag.Parse()
	var err error
	if *relay != "" {
		err = relayMain(*relay)
	} else if *serveFile != "" {
		err = bareServeMain(*serveFile)
	} else if *profile != "" {
		err = profileMain(*profile, *workloads, *profileN)
	} else {
		err = run(*quick, *write, *only)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// absPaths makes the repository paths absolute.
func absPaths() error {
	for _, p := range []*string{&kernelgateBin, &specDir, &compareBin} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		*p = abs
	}
	return nil
}

func profileMain(dir, workloads string, n int) error {
	if err := absPaths(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return runProfiles(ctx, dir, workloads, n)
}

func run(quick bool, write, only string) error {
	if err := absPaths(); err != nil {
		return err
	}
	if _, err := os.Stat(kernelgateBin); err != nil {
		return fmt.Errorf("%w: run make build first", err)
	}
	b := &bench{opt: full, specs: kernelspecs.Load([]string{specDir}), t0: time.Now()}
	if quick {
		b.opt = options{starts: 2, roundTrips: 30, rtKernels: 2, warmup: 5, poolRuns: 3,
			loadKernels: 4, loadClients: 2, loadCount: 10, loadRounds: 1,
			streamRuns: 1, streamMiB: 20, density: []int{0, 2, 4}, jsDensity: 2, idle: 3 * time.Second,
			filesMiB: 64, filesRuns: 1, adopt: 5, failovers: 2}
	}
	for _, k := range kernels {
		if _, err := b.specs.Get(k.spec); err != nil {
			return fmt.Errorf("kernelspec %s: %w (run make kernels)", k.spec, err)
		}
	}
	want := map[string]bool{}
	for _, s := range strings.Split(only, ",") {
		if s = strings.TrimSpace(s); s != "" {
			want[s] = true
		}
	}
	sections := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"start", b.benchStart},
		{"roundtrip", b.benchRoundTrip},
		{"pool", b.benchPool},
		{"stream", b.benchStream},
		{"load", b.benchLoad},
		{"density", b.benchDensity},
		{"launcher", b.benchLauncher},
		{"warm", b.benchWarm},
		{"files", b.benchFiles},
		{"agents", b.benchAgents},
		{"commands", b.benchCommands},
		{"bigoutput", b.benchBigOutput},
		{"k8s", b.benchK8s},
		{"state", b.benchState},
		{"replicas", b.benchReplicas},
		{"r", b.benchR},
	}
	for name := range want {
		found := false
		for _, s := range sections {
			found = found || s.name == name
		}
		if !found {
			return fmt.Errorf("-only: no section %q", name)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	machine := describeMachine(ctx)
	lctx, stopLoad := context.WithCancel(ctx)
	go machine.sampleLoad(lctx)
	defer stopLoad()
	defer b.stopServers()
	// The state, replicas and warm sections start kernelgates of their own.
	shared := len(want) == 0
	for name := range want {
		shared = shared || name != "state" && name != "replicas" && name != "warm"
	}
	if shared {
		if err := b.startServers(ctx); err != nil {
			return err
		}
	}
	for _, s := range sections {
		if len(want) > 0 && !want[s.name] {
			continue
		}
		t := time.Now()
		progress("== %s", s.name)
		if err := s.fn(ctx); err != nil {
			if len(b.rows) > 0 {
				fmt.Println("The figures taken before the failure:\n\n" + renderTable(b.rows))
			}
			b.printServerLogs()
			return fmt.Errorf("%s: %w", s.name, err)
		}
		progress("== %s done in %v", s.name, time.Since(t).Round(time.Second))
	}
	b.stopServers()
	stopLoad()
	machine.loadEnd = loadAvg()
	machine.took = time.Since(b.t0)

	table := renderTable(b.rows)
	if n := b.failures.Load(); n > 0 {
		table += fmt.Sprintf("\n%d measurement steps failed once and were repeated (see the log).\n", n)
	}
	fmt.Println(machine.markdown())
	fmt.Println(table)
	fmt.Println(renderGoals(b.goals))
	fmt.Printf("Harness run time: %v\n", machine.took.Round(time.Second))
	if write != "" {
		if err := writeDoc(write, machine.markdown()+"\n"+table+"\n"+renderGoals(b.goals)); err != nil {
			return err
		}
		progress("wrote %s", write)
	}
	return nil
}

// startServers starts the two kernelgate processes and Jupyter Server.
func (b *bench) startServers(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var err error
	progress("starting kernelgate (warm pool of 1 per kernelspec)")
	pool := []string{"--pool-size", "1", "--pool-prewarm", "python,javascript"}
	if b.kg, err = startKernelgate(sctx, "kernelgate", kernelgateBin, pool...); err != nil {
		return err
	}
	if compareBin != "" {
		progress("starting kernelgate B (%s)", compareBin)
		if b.kgB, err = startKernelgate(sctx, "kernelgate B", compareBin, pool...); err != nil {
			return err
		}
	}
	progress("starting kernelgate (--pool-size 0 --late-output-wait=-1ms)")
	if b.kgOff, err = startKernelgate(sctx, "kernelgate (pool off)", kernelgateBin, "--pool-size", "0", "--late-output-wait=-1ms"); err != nil {
		return err
	}
	progress("starting Jupyter Server")
	if b.js, err = startJupyterServer(sctx); err != nil {
		return err
	}
	for _, k := range kernels {
		for _, s := range []*server{b.kg, b.kgB} {
			if s == nil {
				continue
			}
			if err := s.waitPool(sctx, k.spec, 1); err != nil {
				return err
			}
		}
	}
	return nil
}

// printServerLogs prints what each server wrote to stderr, and whether
// it has exited, to explain a failed section.
func (b *bench) printServerLogs() {
	for _, s := range []*server{b.kg, b.kgB, b.kgOff, b.js} {
		if s == nil {
			continue
		}
		state := "running"
		select {
		case <-s.waited:
			state = "exited: " + s.cmd.ProcessState.String()
		default:
		}
		fmt.Fprintf(os.Stderr, "--- %s (%s), the end of its log:\n%s\n", s.name, state, strings.TrimSpace(s.log.String()))
	}
}

func (b *bench) stopServers() {
	for _, s := range []*server{b.kg, b.kgB, b.kgOff, b.js} {
		if s != nil {
			s.stop()
		}
	}
}

// progress prints a line to stderr with the time since the start.
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// measure runs fn and returns how long it took.
func measure(fn func() error) (time.Duration, error) {
	t0 := time.Now()
	err := fn()
	return time.Since(t0), err
}

// within bounds ctx for one step of the harness.
func within(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}

var errWrong = errors.New("wrong result")

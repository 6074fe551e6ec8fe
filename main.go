// Command kernelgate serves Jupyter kernels over the Jupyter Server REST and
// websocket API and over a code-interpreter API.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"

	"kernelgate/cluster"
	"kernelgate/gateway"
	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
	kubeprov "kernelgate/provision/kubernetes"
	localprov "kernelgate/provision/local"
	"kernelgate/runs"
	"kernelgate/sessions"
	"kernelgate/state"
	"kernelgate/web"
	"kernelgate/workspace"
)

// version is kernelgate's version, set at build time.
var version = "0.1.0"

const usage = `kernelgate: a Jupyter kernel gateway and code interpreter.

Usage:
  kernelgate serve [flags]   serve the API (kernelgate serve --help lists the flags)
  kernelgate hash-key <key>  print the sha256 form of an API key for a key file
  kernelgate version         print the version
  kernelgate kernel-entry -- ARGV...
                             launch a kernel in a pod (kubernetes-provisioner)
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		cfg, err := parseConfig(args[1:], os.Getenv, stderr)
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if err != nil {
			fmt.Fprintln(stderr, "kernelgate:", err)
			return 2
		}
		if err := serve(cfg, stdout, stderr); err != nil {
			fmt.Fprintln(stderr, "kernelgate:", err)
			return 1
		}
		return 0
	case "hash-key":
		if len(args) != 2 {
			fmt.Fprintln(stderr, "usage: kernelgate hash-key <secret>")
			return 2
		}
		fmt.Fprintln(stdout, gateway.HashSecret(args[1]))
		return 0
	case "kernel-entry":
		err := kubeprov.Entry(args[1:])
		fmt.Fprintln(stderr, "kernelgate:", err)
		return 127
	case "version", "--version":
		fmt.Fprintln(stdout, "kernelgate", version)
		return 0
	case "help", "--help", "-h":
		fmt.Fprint(stdout, usage+"\n")
		parseConfig([]string{"--help"}, os.Getenv, stdout)
		return 0
	}
	fmt.Fprint(stderr, usage)
	return 2
}

func newLogger(cfg *config, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch cfg.LogFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json")
}

func joinHostPort(host, port string) string { return net.JoinHostPort(host, port) }

func serve(cfg *config, stdout, stderr io.Writer) error {
	log, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	for _, f := range cfg.secretsInArgv {
		log.Warn("a secret was given on the command line, where every local user and every kernel can read it (/proc/<pid>/cmdline): set it in the environment or in a file instead",
			"flag", f, "instead", map[string]string{"--token": "KERNELGATE_TOKEN or --token-file", "--api-keys": "KERNELGATE_API_KEYS or --api-keys-file",
				"--state-url": "KERNELGATE_STATE_URL, PGPASSWORD or ~/.pgpass"}[f])
	}
	if cfg.Procs < 0 {
		return fmt.Errorf("--procs must be 0 (automatic) or more")
	}
	procs := gatewayProcs(cfg.Procs, os.Getenv("GOMAXPROCS") != "", runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(procs)
	log.Info("gateway threads", "procs", procs, "cpus", runtime.NumCPU())
	keys, err := loadKeys(cfg)
	if err != nil {
		return err
	}
	if cfg.Token == "" && len(keys) == 0 && !isLoopback(cfg.IP) {
		return fmt.Errorf("refusing to listen on %s without a token: set --token (or KERNELGATE_TOKEN), or listen on 127.0.0.1", cfg.IP)
	}

	specs := kernelspecs.Load(kernelspecs.SearchPath(cfg.KernelspecDirs, os.Getenv))
	for _, p := range specs.Problems() {
		log.Warn("kernelspec skipped: fix or remove its kernel.json", "path", p.Path, "err", p.Err)
	}
	for _, s := range specs.All() {
		log.Info("kernelspec", "name", s.Name, "language", s.Language, "dir", s.Dir)
	}
	if len(specs.Names()) == 0 {
		log.Warn("no kernelspecs found: run `make kernels` or pass --kernelspec-dir", "searched", specs.Dirs())
	}

	langs, err := cfg.languages()
	if err != nil {
		return err
	}
	memory, err := sessions.ParseBytes(cfg.KernelMemory)
	if err != nil {
		return fmt.Errorf("--kernel-memory: %w", err)
	}
	maxUpload, err := sessions.ParseBytes(cfg.MaxUpload)
	if err != nil {
		return fmt.Errorf("--max-upload: %w", err)
	}
	stateDir, err := state.ResolveDir(cfg.StateDir, cfg.StateDirSet, os.Getenv)
	if err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	// store, and storeID naming it to the kernels launched for it (see
	// localprov.Provisioner.StateID): "" without one.
	var store state.Store
	var replicaStore *state.Postgres // a replica's store, nil otherwise
	storeID := ""
	if cfg.StateURL != "" {
		// The database keeps the records; the state directory only the
		// contexts' workspaces.
		if cfg.ClusterSecret == nil {
			return fmt.Errorf("--state-url: the gateways on one database are replicas that forward requests to each other, signed with a cluster secret: set --cluster-secret-file or KERNELGATE_CLUSTER_SECRET (the same on every replica; docs/replicas.md)")
		}
		octx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		// Every gateway on the database is a replica of the others
		// (docs/replicas.md), under an id of its own for this process.
		pg, err := state.OpenPostgres(octx, cfg.StateURL, state.PostgresOptions{Options: state.Options{Logger: log}, Replica: uuid.NewString()})
		cancel()
		if err != nil {
			return fmt.Errorf("--state-url: %w", err)
		}
		defer pg.Close()
		store = pg
		replicaStore = pg
		storeID = "postgres:" + pg.Where()
		log.Info("state kept in PostgreSQL", "db", pg.Where(), "replica", pg.Replica(), "workspaces_dir", stateDir, "keep_kernels", cfg.KeepKernels, "orphan_timeout", cfg.OrphanTimeout)
	} else if stateDir != "" {
		bolt, err := state.Open(filepath.Join(stateDir, state.FileName), state.Options{Logger: log})
		if err != nil {
			return fmt.Errorf("--state-dir: %w", err)
		}
		defer bolt.Close()
		store = bolt
		storeID = stateDir
		log.Info("state kept", "dir", stateDir, "keep_kernels", cfg.KeepKernels, "orphan_timeout", cfg.OrphanTimeout)
	} else {
		log.Info("state kept in memory only: a restart loses kernels, contexts, sessions and runs")
		if cfg.KeepKernels {
			log.Warn("--keep-kernels needs a state directory: kernels will be shut down at exit")
		}
	}
	keep := cfg.KeepKernels && store != nil
	// Contexts' workspaces: --workspace-root, else with a state directory
	// a folder of it (context files live as long as the contexts kept),
	// else a temporary folder. Only --workspace-root also bounds the
	// working directories Jupyter clients choose. Kernels sandboxed as
	// another user cannot reach into the private state directory: they
	// need --workspace-root for their files to be kept.
	wsRoot := cfg.WorkspaceRoot
	if wsRoot == "" && stateDir != "" && !(cfg.Sandbox && os.Getuid() == 0) {
		wsRoot = filepath.Join(stateDir, "workspaces")
	}
	var workspaces *workspace.Root
	if wsRoot != "" {
		if workspaces, err = workspace.OpenRoot(wsRoot); err != nil {
			return fmt.Errorf("--workspace-root: %w", err)
		}
		defer workspaces.Close()
		// One gateway per root, as per state directory: another would
		// read and delete this one's workspaces. The lock dies with the
		// process, so a restart after a crash takes it again.
		owner := "state in memory only"
		if stateDir != "" {
			owner = "state dir " + stateDir
		}
		take := workspace.LockRoot
		if replicaStore != nil {
			// Replicas share one root (docs/replicas.md): each context's
			// folder is its owner's, whichever replica that is.
			take = workspace.ShareRoot
		}
		lock, err := take(workspaces.Dir(), owner)
		if err != nil {
			return fmt.Errorf("--workspace-root: %w", err)
		}
		defer lock.Close()
	}
	maxFrame, err := sessions.ParseBytes(cfg.MaxKernelFrame)
	if err != nil {
		return fmt.Errorf("--max-kernel-message: %w", err)
	}
	var sandbox *localprov.SandboxConfig
	if cfg.Sandbox {
		hide := append([]string{}, cfg.SandboxHide...)
		for _, secret := range []string{cfg.APIKeysFile, cfg.TokenFile, cfg.ClusterSecretFile} {
			if secret == "" {
				continue
			}
			if abs, err := filepath.Abs(secret); err == nil {
				hide = append(hide, abs)
			}
		}
		sandbox = &localprov.SandboxConfig{Network: cfg.SandboxNetwork, Hide: hide}
		if os.Getuid() == 0 {
			sandbox.UID, sandbox.GID = cfg.SandboxUID, cfg.SandboxGID
		}
	}
	metrics := gateway.NewMetrics()
	runtimeDir := cfg.RuntimeDir
	if runtimeDir == "" {
		runtimeDir = localprov.DefaultRuntimeDir()
	}
	seed := filepath.Join(runtimeDir, "home-seed")
	local := &localprov.Provisioner{RuntimeDir: runtimeDir, Logger: log, HomeSeed: seed, PythonLauncher: cfg.PythonLauncher,
		Detached: store != nil && localprov.LocalAdoption, StateID: storeID, OrphanTimeout: cfg.OrphanTimeout}
	prov := jupyter.NewRegistry(cfg.DefaultProvisioner)
	prov.Register(localprov.Name, local)
	prov.Alias(localprov.InfoName, localprov.Name)
	wsDir := ""
	if workspaces != nil {
		wsDir = workspaces.Dir()
	}
	kube, err := startKubernetes(cfg, specs, prov, wsDir, log)
	if err != nil {
		return err
	}
	if kube != nil {
		defer kube.Stop()
	}
	// Listening starts before the state is restored (requests wait for
	// serving to begin): a replica advertises its address as it joins.
	l, err := net.Listen("tcp", cfg.addr())
	if err != nil {
		return err
	}
	defer l.Close()
	var rep *cluster.Replica
	var lostTo atomic.Pointer[sessions.Manager]
	if replicaStore != nil {
		if cfg.Cluster.URL, err = advertiseURL(cfg.Cluster.URL, l.Addr()); err != nil {
			return err
		}
		ccfg := cfg.Cluster
		ccfg.Logger = log
		rep, err = cluster.Start(replicaStore, ccfg, func(lost []state.Fence) {
			if m := lostTo.Load(); m != nil {
				m.LeasesLost(lost)
			}
		})
		if err != nil {
			return err
		}
		defer func() {
			lctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := rep.Leave(lctx); err != nil {
				log.Warn("replica row not removed: the others stop seeing this one within the lease", "err", err)
			}
		}()
		log.Info("serving as a replica", "replica", replicaStore.Replica(), "advertise_url", rep.URL(), "lease", rep.Lease())
	}
	var ownership sessions.Ownership
	var peerKernels func(context.Context) (int, error)
	if rep != nil {
		ownership = rep
		// --max-kernels counts the other replicas' kernels too.
		peerKernels = replicaStore.PeerKernels
		if kube != nil {
			// The pod sweep leaves what another replica owns, may
			// adopt, or (without a lease yet) created.
			lease := rep.Lease()
			kube.Replica = replicaStore.Replica()
			kube.Owned = func(ctx context.Context, id string) (bool, error) {
				claimed, err := replicaStore.LeaseClaimed(ctx, id, 2*lease+adoptionGrace)
				if claimed || err != nil {
					return claimed, err
				}
				// Released with its record kept: left for another
				// replica's failover scan to adopt.
				free, err := replicaStore.FreeKernels(ctx)
				return slices.Contains(free, id), err
			}
			kube.LiveReplica = func(ctx context.Context, id string) (bool, error) {
				live, err := replicaStore.LiveReplicas(ctx, lease)
				return slices.ContainsFunc(live, func(r state.Replica) bool { return r.ID == id }), err
			}
		}
	}
	mgr := sessions.New(sessions.Config{
		DefaultKernel: cfg.DefaultKernel,
		MaxKernels:    cfg.MaxKernels,
		StartTimeout:  cfg.StartTimeout,
		// 0 turns the heartbeat off: sessions reads that as its default.
		HeartbeatTimeout: cmp.Or(cfg.HeartbeatTimeout, -1),
		HeartbeatPeriod:  cfg.HeartbeatPeriod,
		CullIdleTimeout:  cfg.CullIdle,
		CullInterval:     cfg.CullInterval,
		CullConnected:    cfg.CullConnected,
		CullBusy:         cfg.CullBusy,
		EnvAllow:         cfg.EnvAllow,
		Languages:        langs,
		QueueLimit:       cfg.QueueLimit,
		RunLimits:        runs.Limits{LogBytes: cfg.MaxLogBytes, ResultBytes: cfg.MaxResultBytes},
		RunRetention:     cfg.RunRetention,
		RunsKept:         cfg.RunsKept,
		InterruptGrace:   cfg.InterruptGrace,
		PoolSize:         cfg.PoolSize,
		PoolMax:          cfg.PoolMax,
		PoolIdle:         cfg.PoolIdle,
		LateOutputWait:   cfg.LateOutputWait,
		Observer:         metrics,
		KernelLimits:     localprov.Limits{MemoryBytes: memory, Pids: cfg.KernelPids, NoFile: cfg.KernelNoFile},
		Sandbox:          sandbox,
		WorkspaceRoot:    cfg.WorkspaceRoot,
		Workspaces:       workspaces,
		PipIndexURL:      cfg.PipIndexURL,
		PipFindLinks:     cfg.PipFindLinks,
		PipNoIndex:       cfg.PipNoIndex,
		MaxKernelFrame:   maxFrame,
		Store:            store,
		Ownership:        ownership,
		PeerKernels:      peerKernels,
	}, specs, prov, log)
	lostTo.Store(mgr)
	restored, err := mgr.Restore(context.Background())
	if err != nil {
		mgr.Close(context.Background())
		return fmt.Errorf("state: %w", err)
	}
	// What gateway processes that died left behind goes next: processes
	// their kernels started, kernel directories with keys, cgroups; the
	// kernels adopted again are kept.
	swept, err := local.Sweep(append(restored.Keep, othersKernels(replicaStore, log)...))
	if swept != (localprov.Swept{}) {
		log.Info("removed what earlier gateway processes left", "kernel_dirs", swept.Dirs, "cgroups", swept.Cgroups, "processes_killed", swept.Processes)
	}
	if err != nil {
		log.Warn("could not remove all that earlier gateway processes left", "err", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	stopSweep := func() {}
	if kube != nil {
		owners := podOwners{store: store}
		if replicaStore != nil {
			owners.holder, owners.self = leaseHolder(replicaStore), replicaStore.Replica()
		}
		if err := adoptPods(ctx, kube, mgr, owners, log); err != nil {
			mgr.Close(context.Background())
			return err
		}
		if rep != nil {
			// Every replica sweeps what no live replica serves.
			stopSweep = sweepPods(kube, mgr, podSweepLeases*rep.Lease(), log)
			defer stopSweep()
		}
	}
	// Build the kernels' home seed (matplotlib's font cache), then fill the
	// warm pools, in the background: serving starts at once.
	warmed := make(chan struct{})
	go func() {
		defer close(warmed)
		if py := pythonOf(specs); py != "" {
			if err := localprov.PrepareHomeSeed(ctx, seed, py); err != nil {
				log.Info("kernels start without a font cache seed; their first plot builds it", "err", err)
			}
		}
		if err := mgr.WarmPools().Prewarm(cfg.PoolPrewarm); err != nil {
			log.Warn("warm pool not filled at start", "err", err)
		}
	}()
	var gatewayOwners gateway.Owners
	var gatewayCluster gateway.Cluster
	if rep != nil {
		gatewayOwners = owners{mgr: mgr, store: replicaStore}
		gatewayCluster = clusterRecords{mgr: mgr, store: replicaStore, rep: rep}
	}
	srv := gateway.New(gateway.Config{
		Token:          cfg.Token,
		APIKeys:        keys,
		AllowOrigins:   cfg.AllowOrigins,
		BaseURL:        cfg.BaseURL,
		MaxBodyBytes:   cfg.MaxBody,
		MaxFrameBytes:  cfg.MaxFrame,
		MaxUploadBytes: maxUpload,
		Metrics:        metrics,
		MetricsOpen:    cfg.MetricsOpen,
		ClusterSecret:  cfg.ClusterSecret,
		Owners:         gatewayOwners,
		Cluster:        gatewayCluster,
		ProductVersion: version,
		Web:            web.Handler(),
	}, mgr, log)

	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	url := "http://" + l.Addr().String() + srv.BaseURL()
	if cfg.Token == "" && len(keys) == 0 {
		log.Warn("no token set: anyone on this machine can run code; listening on loopback only")
	}
	fmt.Fprintf(stdout, "kernelgate %s serving at %s\n", version, url)

	select {
	case <-ctx.Done():
		log.Info("shutting down", "grace", cfg.ShutdownGrace)
	case err := <-served:
		if err != nil {
			log.Error("server stopped", "err", err)
		}
	}
	// From here a second SIGINT or SIGTERM ends the process at once.
	stop()
	stopSweep()
	finished := make(chan struct{})
	limit := cfg.ShutdownGrace + shutdownStop
	if rep != nil {
		limit += cfg.ShutdownGrace + handoverStop
	}
	go func() {
		defer close(finished)
		if rep != nil {
			// While other replicas serve, its kernels go to them.
			handOver(mgr, srv, cfg.ShutdownGrace, log)
		}
		shutdown(srv, mgr, cfg.ShutdownGrace, keep, rep != nil)
		<-warmed
		localprov.StopZygotes()
	}()
	bound := time.NewTimer(limit)
	defer bound.Stop()
	select {
	case <-finished:
	case <-bound.C:
		// The process ends here, without the deferred closes: they would
		// run beside the shutdown still under way and are not bounded.
		// The next start removes what kernels that outlived the process
		// leave (localprov.Provisioner.Sweep).
		fmt.Fprintf(stderr, "kernelgate: shutdown did not finish within %v: exiting anyway\n", limit)
		os.Exit(1)
	}
	if keep {
		log.Info("kernels left running for the next start", "dir", stateDir, "orphan_timeout", cfg.OrphanTimeout)
	}
	log.Info("stopped")
	return nil
}

// shutdownStop bounds what a shutdown takes after its grace: stopping the
// kernels (shutdown_request, SIGTERM, SIGKILL) and ending the requests
// left.
const shutdownStop = 15 * time.Second

// shutdown refuses new requests and lets those in flight finish within
// grace, then stops the kernels, which ends the runs still going (lost),
// and closes the connections still open once their requests have ended.
func shutdown(srv *gateway.Server, mgr *sessions.Manager, grace time.Duration, keep, replica bool) {
	gctx, cancel := context.WithTimeout(context.Background(), grace)
	srv.Shutdown(gctx)
	cancel()
	if replica {
		// The kernels started by the requests that ended meanwhile.
		mgr.HandOver(context.Background(), 0, srv.AskToAdopt)
	}
	kctx, cancel := context.WithTimeout(context.Background(), shutdownStop*2/3)
	if keep {
		mgr.Detach(kctx)
	} else {
		mgr.Close(kctx)
	}
	cancel()
	cctx, cancel := context.WithTimeout(context.Background(), shutdownStop/6)
	srv.Close(cctx)
	cancel()
}

// loadKeys reads the API keys of --api-keys-file and --api-keys.
func loadKeys(cfg *config) ([]gateway.APIKey, error) {
	var keys []gateway.APIKey
	if cfg.APIKeysFile != "" {
		k, err := gateway.LoadAPIKeys(cfg.APIKeysFile)
		if err != nil {
			return nil, fmt.Errorf("--api-keys-file: %w", err)
		}
		keys = append(keys, k...)
	}
	for _, entry := range strings.Split(cfg.APIKeys, ";") {
		if entry = strings.TrimSpace(entry); entry == "" {
			continue
		}
		k, err := gateway.ParseAPIKey(entry)
		if err != nil {
			return nil, fmt.Errorf("--api-keys: %w", err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// pythonOf returns the program of the first Python kernelspec.
func pythonOf(specs *kernelspecs.Catalog) string {
	for _, s := range specs.All() {
		if strings.EqualFold(s.Language, "python") && len(s.Argv) > 0 {
			return s.Argv[0]
		}
	}
	return ""
}

func isLoopback(ip string) bool {
	if ip == "localhost" {
		return true
	}
	p := net.ParseIP(ip)
	return p != nil && p.IsLoopback()
}

// adoptionGrace is how long, beyond twice the lease, a kernel pod whose
// owner stopped renewing is kept from the sweep for another replica to
// adopt: the scan runs every lease/3, and an adoption of a pod takes
// seconds.
const adoptionGrace = 30 * time.Second

// advertiseURL is the URL the other replicas reach this one at: given,
// else the listen address (the host's name when listening on every
// address).
func advertiseURL(given string, addr net.Addr) (string, error) {
	if given != "" {
		u, err := url.Parse(given)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "", fmt.Errorf("--advertise-url %q: want http://host:port or https://host:port", given)
		}
		return u.Scheme + "://" + u.Host, nil
	}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if host, err = os.Hostname(); err != nil {
			return "", fmt.Errorf("--advertise-url: listening on every address and the host has no name (%v): set --advertise-url", err)
		}
	}
	return "http://" + net.JoinHostPort(host, port), nil
}

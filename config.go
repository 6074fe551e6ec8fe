package main

import (
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"kernelgate/cluster"
	"kernelgate/forward"
	"kernelgate/gateway"
	"kernelgate/jupyter"
	kubeprov "kernelgate/provision/kubernetes"
	localprov "kernelgate/provision/local"
	"kernelgate/sessions"
	"kernelgate/state"
)

// config is everything kernelgate serve can be told, by flag or by the
// matching KERNELGATE_* environment variable (a flag wins).
type config struct {
	IP        string
	Port      int
	Token     string
	TokenFile string
	// secretsInArgv names the flags that carried a secret on the command
	// line, where every local user can read it (/proc/<pid>/cmdline).
	secretsInArgv  []string
	AllowOrigins   []string
	KernelspecDirs []string
	DefaultKernel  string
	MaxKernels     int
	CullIdle       time.Duration
	CullInterval   time.Duration
	CullConnected  bool
	CullBusy       bool
	EnvAllow       []string
	BaseURL        string
	RuntimeDir     string
	LogLevel       string
	LogFormat      string
	MaxBody        int64
	MaxFrame       int64
	StartTimeout   time.Duration

	HeartbeatTimeout time.Duration
	HeartbeatPeriod  time.Duration

	Languages      []string
	PoolSize       int
	PoolMax        int
	PoolIdle       time.Duration
	PoolPrewarm    []string
	QueueLimit     int
	MaxLogBytes    int
	MaxResultBytes int
	RunRetention   time.Duration
	RunsKept       int
	InterruptGrace time.Duration
	LateOutputWait time.Duration
	Procs          int
	ShutdownGrace  time.Duration

	APIKeysFile string
	APIKeys     string
	MetricsOpen bool

	Sandbox        bool
	SandboxNetwork bool
	SandboxHide    []string
	SandboxUID     int
	SandboxGID     int
	KernelMemory   string
	KernelPids     int
	KernelNoFile   uint64
	WorkspaceRoot  string
	MaxKernelFrame string
	PythonLauncher string
	MaxUpload      string
	PipIndexURL    string
	PipFindLinks   []string
	PipNoIndex     bool

	// StateDir is --state-dir as given; StateDirSet says it was given
	// (state.ResolveDir applies the default).
	StateDir    string
	StateDirSet bool
	// StateURL is --state-url: a postgres:// URL puts the state in
	// PostgreSQL instead of the state directory's file.
	StateURL string
	// ClusterSecretFile is --cluster-secret-file; ClusterSecret is the
	// secret read from it, or from KERNELGATE_CLUSTER_SECRET (the secret
	// itself): replicas sign the requests they forward to each other
	// with it (docs/replicas.md).
	ClusterSecretFile string
	ClusterSecret     *forward.Secret
	// Cluster is this gateway's part among the replicas of a
	// --state-url (--advertise-url, --lease).
	Cluster cluster.Config

	// Provisioners (docs/kubernetes.md).
	DefaultProvisioner string
	Kubeconfig         string
	KubeNamespace      string
	Release            string
	// KernelWorkspaceClaim is the PersistentVolumeClaim mounted at
	// --workspace-root, whose context folders kernel pods mount.
	KernelWorkspaceClaim string

	// KeepKernels leaves kernels running at SIGTERM/SIGINT, for the next
	// start on the same state directory; OrphanTimeout ends those no
	// gateway adopts again.
	KeepKernels   bool
	OrphanTimeout time.Duration
}

// optionalString is a string flag that remembers whether it was set, so
// that an empty value can mean something else than the default.
type optionalString struct {
	v   *string
	set *bool
}

func (o optionalString) String() string {
	if o.v == nil {
		return ""
	}
	return *o.v
}

func (o optionalString) Set(s string) error {
	*o.v, *o.set = s, true
	return nil
}

// listFlag is a repeatable flag; the environment gives it comma-separated.
type listFlag struct{ v *[]string }

func (l listFlag) String() string {
	if l.v == nil {
		return ""
	}
	return strings.Join(*l.v, ",")
}
func (l listFlag) Set(s string) error {
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*l.v = append(*l.v, part)
		}
	}
	return nil
}

// sizeString is n bytes as a size flag takes it: in the largest binary
// unit that divides it.
func sizeString(n int64) string {
	for _, u := range []struct {
		unit string
		mult int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.mult && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.unit
		}
	}
	return strconv.FormatInt(n, 10)
}

// languageTable is the default --language table, as --help shows it.
func languageTable(d sessions.Config) string {
	var out []string
	for _, lang := range slices.Sorted(maps.Keys(d.Languages)) {
		out = append(out, lang+"="+d.Languages[lang])
	}
	s := strings.Join(out, ", ")
	for _, lang := range d.OptionalLanguages {
		s += ", " + lang + " served only where its kernelspec is installed"
	}
	return s
}

// parseConfig reads the serve flags from args and the environment.
func parseConfig(args []string, getenv func(string) string, out io.Writer) (*config, error) {
	c := &config{}
	// The defaults are the packages' own: what they fill in for a value
	// left zero.
	sd, gd := sessions.DefaultConfig(), gateway.DefaultConfig()
	fs := flag.NewFlagSet("kernelgate serve", flag.ContinueOnError)
	fs.SetOutput(out)
	type entry struct{ flag, env string }
	var entries []entry
	add := func(name string) {
		entries = append(entries, entry{name, "KERNELGATE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))})
	}

	fs.StringVar(&c.IP, "ip", "127.0.0.1", "address to listen on")
	add("ip")
	fs.IntVar(&c.Port, "port", 8888, "port to listen on")
	add("port")
	fs.StringVar(&c.Token, "token", "", "token every request but GET /api must carry; without one kernelgate listens on loopback only. On the command line every local user can read it: set it in the environment variable or use --token-file")
	add("token")
	fs.StringVar(&c.TokenFile, "token-file", "", "file holding the token (surrounding whitespace ignored): with the environment variable, the safe ways to give the token")
	add("token-file")
	fs.StringVar(&c.APIKeysFile, "api-keys-file", "", "file of API keys, one \"name scopes secret\" a line (scopes read, exec or read,exec; the secret may be its sha256:<hex> from kernelgate hash-key)")
	add("api-keys-file")
	fs.StringVar(&c.APIKeys, "api-keys", "", "API keys as name:scopes:secret entries separated by ; (on the command line every local user can read them: prefer the environment variable or --api-keys-file)")
	add("api-keys")
	fs.BoolVar(&c.Sandbox, "sandbox", false, "run kernels in bubblewrap: read-only system, private /tmp, HOME and working dir, own pid namespace, no network unless --sandbox-network")
	add("sandbox")
	fs.BoolVar(&c.SandboxNetwork, "sandbox-network", false, "let sandboxed kernels use the network")
	add("sandbox-network")
	fs.IntVar(&c.SandboxUID, "sandbox-uid", 65534, "host user sandboxed kernels run as when the gateway runs as root")
	add("sandbox-uid")
	fs.IntVar(&c.SandboxGID, "sandbox-gid", 65534, "host group sandboxed kernels run as when the gateway runs as root")
	add("sandbox-gid")
	fs.Var(listFlag{&c.SandboxHide}, "sandbox-hide", "host path a sandboxed kernel sees empty, e.g. a secrets directory (repeatable; the API keys file is always hidden)")
	add("sandbox-hide")
	fs.StringVar(&c.KernelMemory, "kernel-memory", "4GiB", "memory limit of each kernel (cgroup), e.g. 512MiB; 0 for none; a kernelspec's metadata.kernelgate.memory overrides it")
	add("kernel-memory")
	fs.IntVar(&c.KernelPids, "kernel-pids", 1024, "most processes and threads per kernel (cgroup); 0 for none")
	add("kernel-pids")
	fs.Uint64Var(&c.KernelNoFile, "kernel-nofile", 4096, "open files per kernel process (RLIMIT_NOFILE); 0 leaves it as inherited")
	add("kernel-nofile")
	fs.StringVar(&c.MaxKernelFrame, "max-kernel-message", sizeString(jupyter.DefaultMaxFrame), "largest message a kernel may send, all its frames together; larger output is cut to the run's limits, a kernel sending any other larger message is stopped")
	add("max-kernel-message")
	fs.StringVar(&c.WorkspaceRoot, "workspace-root", "", "directory holding each context's workspace (its kernel's working directory, its files and packages) and every working directory a Jupyter client chooses; empty: a temporary directory removed at exit")
	add("workspace-root")
	fs.StringVar(&c.MaxUpload, "max-upload", sizeString(gd.MaxUploadBytes), "largest file uploaded into a context's workspace, e.g. 512MiB")
	add("max-upload")
	fs.StringVar(&c.PipIndexURL, "pip-index-url", "", "package index pip installs contexts' packages from (PIP_INDEX_URL; default pip's)")
	add("pip-index-url")
	fs.Var(listFlag{&c.PipFindLinks}, "pip-find-links", "folder or URL of wheels pip also installs from (repeatable)")
	add("pip-find-links")
	fs.BoolVar(&c.PipNoIndex, "pip-no-index", false, "install contexts' packages from --pip-find-links only, never from an index")
	add("pip-no-index")
	fs.BoolVar(&c.MetricsOpen, "metrics-open", false, "serve /metrics without credentials (for a scraper on a trusted network)")
	add("metrics-open")
	fs.Var(listFlag{&c.AllowOrigins}, "allow-origin", "origin allowed for CORS and websockets besides the gateway's own, e.g. https://lab.example.com; * allows any (repeatable)")
	add("allow-origin")
	fs.Var(listFlag{&c.KernelspecDirs}, "kernelspec-dir", "directory of kernelspecs searched before the Jupyter path (repeatable)")
	entries = append(entries, entry{"kernelspec-dir", "KERNELGATE_KERNELSPEC_DIRS"})
	fs.StringVar(&c.DefaultKernel, "default-kernel", sd.DefaultKernel, "kernelspec used when a request names none")
	add("default-kernel")
	fs.IntVar(&c.MaxKernels, "max-kernels", 0, "most kernel processes at once, starting, running, pooled or stopping (0: no limit); a pooled kernel gives way to a user's")
	add("max-kernels")
	fs.DurationVar(&c.CullIdle, "cull-idle-timeout", 0, "shut down kernels idle this long (0: never)")
	add("cull-idle-timeout")
	fs.DurationVar(&c.CullInterval, "cull-interval", sd.CullInterval, "how often idle kernels are looked for")
	add("cull-interval")
	fs.BoolVar(&c.CullConnected, "cull-connected", false, "cull idle kernels even with clients connected")
	add("cull-connected")
	fs.BoolVar(&c.CullBusy, "cull-busy", false, "cull kernels even while busy")
	add("cull-busy")
	fs.Var(listFlag{&c.EnvAllow}, "env-allow", "environment variable a kernel-create request may set besides KERNEL_* (repeatable)")
	add("env-allow")
	fs.StringVar(&c.BaseURL, "base-url", gd.BaseURL, "path prefix kernelgate is served under")
	add("base-url")
	fs.Var(optionalString{&c.StateDir, &c.StateDirSet}, "state-dir", "directory of the state store, which keeps kernels, contexts, sessions and runs across restarts (default $XDG_STATE_HOME/kernelgate, else ~/.local/state/kernelgate); an empty value keeps them in memory only")
	add("state-dir")
	fs.StringVar(&c.StateURL, "state-url", "", "postgres://user:password@host/db: keep the state in PostgreSQL (13 or later) instead of the file of --state-dir, which then holds only the contexts' workspaces; every gateway started on one database is a replica serving one set of kernels (docs/replicas.md)")
	add("state-url")
	fs.StringVar(&c.ClusterSecretFile, "cluster-secret-file", "", "file holding the secret replicas authenticate each other with (at least 32 bytes, surrounding whitespace ignored; or the secret itself in KERNELGATE_CLUSTER_SECRET); the same on every replica")
	add("cluster-secret-file")
	c.Cluster.Flags(fs)
	add("advertise-url")
	add("lease")
	fs.BoolVar(&c.KeepKernels, "keep-kernels", false, "at SIGTERM or SIGINT leave the kernels running and recorded in the state directory, for the next start to adopt (upgrades, rolling restarts); without it they are shut down")
	add("keep-kernels")
	fs.DurationVar(&c.OrphanTimeout, "orphan-timeout", localprov.DefaultOrphanTimeout, "how long a kernel left running (--keep-kernels, or a gateway that died) lives on when no gateway adopts it again")
	add("orphan-timeout")
	fs.StringVar(&c.RuntimeDir, "runtime-dir", "", "directory for kernels' connection files (default: $TMPDIR/kernelgate-<uid>)")
	add("runtime-dir")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	add("log-level")
	fs.StringVar(&c.LogFormat, "log-format", "text", "text or json")
	add("log-format")
	fs.Int64Var(&c.MaxBody, "max-body", gd.MaxBodyBytes, "largest request body in bytes")
	add("max-body")
	fs.Int64Var(&c.MaxFrame, "max-frame", gd.MaxFrameBytes, "largest websocket message from a client in bytes")
	add("max-frame")
	fs.DurationVar(&c.StartTimeout, "start-timeout", sd.StartTimeout, "how long a kernel may take to start")
	add("start-timeout")
	fs.DurationVar(&c.HeartbeatTimeout, "heartbeat-timeout", sd.HeartbeatTimeout, "how long a kernel with work in flight (a run, a request awaiting its reply) may leave a heartbeat unanswered before it is taken for dead (hung whole or cut off) and restarted; idle kernels are never pinged (0: off)")
	add("heartbeat-timeout")
	fs.DurationVar(&c.HeartbeatPeriod, "heartbeat-period", sd.HeartbeatPeriod, "how often a kernel with work in flight is pinged on its heartbeat channel")
	add("heartbeat-period")
	fs.Var(listFlag{&c.Languages}, "language", "language=kernelspec of the code-interpreter API (repeatable; replaces the whole table, default "+languageTable(sd)+")")
	add("language")
	fs.StringVar(&c.PythonLauncher, "python-launcher", "fork", "how Python kernels start: fork (from a zygote per kernelspec that has imported ipykernel and its metadata.kernelgate.preload; sandboxed kernels are exec'd) or exec (a new interpreter each)")
	add("python-launcher")
	fs.IntVar(&c.PoolSize, "pool-size", sd.PoolSize, "ready kernels kept at least per kernelspec for isolated runs and new contexts, within --max-kernels (0: none)")
	add("pool-size")
	fs.IntVar(&c.PoolMax, "pool-max", sd.PoolMax, "ready kernels a pool may keep per kernelspec when kernels are taken fast (at least --pool-size)")
	add("pool-max")
	fs.DurationVar(&c.PoolIdle, "pool-idle", sd.PoolIdle, "how long after its last take a pool above --pool-size shrinks back to it")
	add("pool-idle")
	fs.Var(listFlag{&c.PoolPrewarm}, "pool-prewarm", "languages whose pool fills at start, not at the first isolated run (default python)")
	add("pool-prewarm")
	fs.IntVar(&c.QueueLimit, "queue-limit", sd.QueueLimit, "runs that may wait per context")
	add("queue-limit")
	fs.IntVar(&c.MaxLogBytes, "max-log-bytes", sd.RunLimits.LogBytes, "stdout and stderr a run keeps, in bytes")
	add("max-log-bytes")
	fs.IntVar(&c.MaxResultBytes, "max-result-bytes", sd.RunLimits.ResultBytes, "result data a run keeps, in bytes")
	add("max-result-bytes")
	fs.DurationVar(&c.RunRetention, "run-retention", sd.RunRetention, "how long finished runs stay readable")
	add("run-retention")
	fs.IntVar(&c.RunsKept, "runs-kept", sd.RunsKept, "how many finished runs stay readable")
	add("runs-kept")
	fs.DurationVar(&c.InterruptGrace, "interrupt-grace", sd.InterruptGrace, "how long an interrupted run may take to stop before its kernel is restarted")
	add("interrupt-grace")
	fs.DurationVar(&c.LateOutputWait, "late-output-wait", sd.LateOutputWait, "quiet period before a Deno run without a result ends, for output Deno publishes after its idle status (negative: none)")
	add("late-output-wait")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", 10*time.Second, "at SIGTERM or SIGINT, how long requests in flight may take to finish before the kernels are stopped (their runs end lost); the process exits at most "+shutdownStop.String()+" later whatever the kernels do, and at once on a second signal. A replica handing its kernels over to the others first lets their runs finish for as long again")
	add("shutdown-grace")
	fs.StringVar(&c.DefaultProvisioner, "default-provisioner", localprov.Name, "provisioner of kernelspecs whose metadata.kernel_provisioner names none: local-provisioner or kubernetes-provisioner")
	add("default-provisioner")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig of the cluster kubernetes-provisioner runs kernel pods in (default: the pod's own service account when kernelgate runs in a cluster)")
	add("kubeconfig")
	fs.StringVar(&c.KubeNamespace, "kubernetes-namespace", "", "namespace of the kernel pods (default: the kubeconfig's, or the gateway pod's own)")
	add("kubernetes-namespace")
	fs.StringVar(&c.Release, "release", "kernelgate", "name that scopes this gateway's kernel pods: gateways of other releases never touch them")
	add("release")
	fs.StringVar(&c.KernelWorkspaceClaim, "kernel-workspace-claim", "", "PersistentVolumeClaim mounted at --workspace-root (ReadWriteMany with replicas): each kernel pod mounts its context's folder of it at the same path, so its kernel and commands see the context's files (empty: kernel pods mount no workspace)")
	add("kernel-workspace-claim")
	fs.IntVar(&c.Procs, "procs", 0, "threads that run the gateway's own code at once (GOMAXPROCS); 0: half the CPUs it may use, at least 1, so the kernels keep the rest (or GOMAXPROCS from the environment, when set)")
	add("procs")

	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: kernelgate serve [flags]\n\nEvery flag can also be set with the environment variable shown.\n\n")
		for _, e := range entries {
			f := fs.Lookup(e.flag)
			def := ""
			if f.DefValue != "" {
				def = " (default " + f.DefValue + ")"
			}
			fmt.Fprintf(out, "  --%s  [%s]%s\n      %s\n", f.Name, e.env, def, f.Usage)
		}
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, e := range entries {
		if v := getenv(e.env); v != "" && !set[e.flag] {
			if err := fs.Set(e.flag, v); err != nil {
				return nil, fmt.Errorf("%s: %w", e.env, err)
			}
		}
	}
	for _, name := range []string{"token", "api-keys"} {
		if set[name] {
			c.secretsInArgv = append(c.secretsInArgv, "--"+name)
		}
	}
	if set["state-url"] && state.RedactURL(c.StateURL) != c.StateURL {
		c.secretsInArgv = append(c.secretsInArgv, "--state-url")
	}
	if c.TokenFile != "" {
		if c.Token != "" {
			return nil, fmt.Errorf("give the token once: --token-file or --token (KERNELGATE_TOKEN), not both")
		}
		b, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		if c.Token = strings.TrimSpace(string(b)); c.Token == "" {
			return nil, fmt.Errorf("--token-file %s is empty", c.TokenFile)
		}
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if c.PoolPrewarm == nil {
		c.PoolPrewarm = []string{"python"}
	}
	if c.PythonLauncher != "fork" && c.PythonLauncher != "exec" {
		return nil, fmt.Errorf("--python-launcher %q: want fork or exec", c.PythonLauncher)
	}
	if c.ShutdownGrace < 0 {
		return nil, fmt.Errorf("--shutdown-grace must be 0 or more")
	}
	if c.DefaultProvisioner != localprov.Name && c.DefaultProvisioner != kubeprov.Name {
		return nil, fmt.Errorf("--default-provisioner %q: want local-provisioner or kubernetes-provisioner", c.DefaultProvisioner)
	}
	if c.Release == "" || len(c.Release) > 63 {
		return nil, fmt.Errorf("--release must be a label value of 1 to 63 characters")
	}
	if c.KernelWorkspaceClaim != "" && c.WorkspaceRoot == "" {
		return nil, fmt.Errorf("--kernel-workspace-claim needs --workspace-root, the folder the claim is mounted at")
	}
	if c.StateURL != "" {
		if !strings.HasPrefix(c.StateURL, "postgres://") && !strings.HasPrefix(c.StateURL, "postgresql://") {
			return nil, fmt.Errorf("--state-url %s: want postgres://…", state.RedactURL(c.StateURL))
		}
		if c.StateDirSet {
			def, err := state.DefaultDir(getenv)
			dir, _ := state.ResolveDir(c.StateDir, true, getenv)
			if err != nil || dir != def {
				return nil, fmt.Errorf("give one state store: --state-url (KERNELGATE_STATE_URL) or --state-dir (KERNELGATE_STATE_DIR), not both")
			}
		}
	}
	if env := getenv("KERNELGATE_CLUSTER_SECRET"); c.ClusterSecretFile != "" || env != "" {
		var err error
		switch {
		case c.ClusterSecretFile != "" && env != "":
			return nil, fmt.Errorf("give the cluster secret once: --cluster-secret-file or KERNELGATE_CLUSTER_SECRET, not both")
		case env != "":
			if c.ClusterSecret, err = forward.NewSecret([]byte(env)); err != nil {
				return nil, fmt.Errorf("KERNELGATE_CLUSTER_SECRET: %w", err)
			}
		default:
			if c.ClusterSecret, err = forward.LoadSecret(c.ClusterSecretFile); err != nil {
				return nil, fmt.Errorf("--cluster-secret-file: %w", err)
			}
		}
	}
	if c.OrphanTimeout < 10*time.Second {
		return nil, fmt.Errorf("--orphan-timeout %v: want at least 10s", c.OrphanTimeout)
	}
	if c.Sandbox && runtime.GOOS != "linux" {
		return nil, fmt.Errorf("--sandbox: bubblewrap sandboxes run on Linux only")
	}
	if c.Port < 0 || c.Port > 65535 {
		return nil, fmt.Errorf("--port %d out of range", c.Port)
	}
	return c, nil
}

func (c *config) addr() string { return joinHostPort(c.IP, strconv.Itoa(c.Port)) }

// languages returns the language → kernelspec map of --language.
func (c *config) languages() (map[string]string, error) {
	if len(c.Languages) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, l := range c.Languages {
		lang, spec, ok := strings.Cut(l, "=")
		if !ok || lang == "" || spec == "" {
			return nil, fmt.Errorf("--language %q: want language=kernelspec", l)
		}
		out[lang] = spec
	}
	return out, nil
}

// gatewayProcs is the GOMAXPROCS kernelgate runs with: the --procs flag
// when given; else the runtime's own when the GOMAXPROCS environment
// variable set it; else half of the runtime's default (the CPUs the
// process may use), at least 1. The gateway's work is short hand-offs
// between goroutines for every message; with a P idle for each, every
// hand-off also wakes a thread that finds nothing to do, CPU the kernels
// on the same machine need (measured in docs/benchmarks.md).
func gatewayProcs(flag int, envSet bool, current int) int {
	switch {
	case flag > 0:
		return flag
	case envSet:
		return current
	}
	return max(1, current/2)
}

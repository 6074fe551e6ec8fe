package sessions

import (
	"context"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
	"kernelgate/provision/local"
	"kernelgate/runs"
	"kernelgate/state"
	"kernelgate/workspace"

	"kernelgate/internal/timefmt"
)

// Config holds the manager's limits and policies. Zero values take the
// defaults of DefaultConfig.
type Config struct {
	// DefaultKernel is the kernelspec used when a request names none.
	DefaultKernel string
	// MaxKernels bounds the kernel processes at once: starting, running,
	// pooled or being stopped (0: no bound). See slots.go.
	MaxKernels int
	// PeerKernels, set when replicas share one database, says how many
	// kernels the other replicas run (state.Postgres.PeerKernels): then
	// MaxKernels bounds the cluster's kernels, this manager's places plus
	// theirs. nil (one gateway): only this manager's. It is called with
	// no lock held, before each kernel start and each pool refill while
	// MaxKernels is set.
	PeerKernels func(ctx context.Context) (int, error)
	// StartTimeout bounds a kernel start.
	StartTimeout time.Duration
	// RestartLimit is how many times a dying kernel is restarted within
	// RestartWindow before it is left dead.
	RestartLimit  int
	RestartWindow time.Duration
	// HeartbeatTimeout is how long a kernel with work in flight (a run,
	// a client's request awaiting its reply) may leave a heartbeat
	// unanswered before it is taken for dead and the restart policy
	// applies (negative: never); it is pinged every HeartbeatPeriod while
	// it has such work, never while it is idle.
	HeartbeatTimeout time.Duration
	HeartbeatPeriod  time.Duration
	// Culling: kernels idle longer than CullIdleTimeout (0: never) are
	// shut down; checked every CullInterval; busy kernels only with
	// CullBusy, kernels with clients only with CullConnected.
	CullIdleTimeout time.Duration
	CullInterval    time.Duration
	CullConnected   bool
	CullBusy        bool
	// EnvAllow names the variables a kernel-create request may set besides
	// KERNEL_*.
	EnvAllow []string
	// Replay buffer kept while no client is connected, and the queue of
	// each client.
	ReplayMessages, ReplayBytes int
	ClientMessages, ClientBytes int

	// Code interpreter: the kernelspec of each language; how many runs
	// may wait per context; what a run keeps of its output; how long and
	// how many finished runs are kept; how long an interrupted run may
	// take to stop before its kernel is restarted.
	Languages map[string]string
	// OptionalLanguages are languages of Languages served only where their
	// kernelspec is installed: Ready does not require them (the default
	// table's r, whose kernel needs R).
	OptionalLanguages []string
	QueueLimit        int
	RunLimits         runs.Limits
	RunRetention      time.Duration
	RunsKept          int
	// RunBytes bounds the memory of the finished runs kept (their events
	// and Executions); the oldest go first.
	RunBytes       int64
	InterruptGrace time.Duration
	// PoolSize is how many ready kernels each kernelspec keeps at least
	// for isolated runs and new contexts (0: no pool); PoolMax is how
	// many it may keep when kernels are taken fast (never fewer than
	// PoolSize); PoolIdle is how long after its last take a pool shrinks
	// back to PoolSize.
	PoolSize int
	PoolMax  int
	PoolIdle time.Duration
	// LateOutputWait is how long a run waits after its reply and idle
	// status for more output, on kernels that publish some late
	// (LateOutputKernels, by kernel_info implementation name); a run
	// whose execute_result has come ends at once (those kernels publish
	// it last). Negative turns the wait off.
	LateOutputWait    time.Duration
	LateOutputKernels []string

	// Observer is told of kernel and run events (metrics); nil is none.
	Observer Observer

	// KernelLimits bound every kernel (a kernelspec's metadata.kernelgate
	// may change them); Sandbox, when set, runs kernels in bubblewrap.
	KernelLimits local.Limits
	Sandbox      *local.SandboxConfig
	// WorkspaceRoot, when set, holds every working directory a caller of
	// the Jupyter surface chooses (KERNEL_WORKING_DIR).
	WorkspaceRoot string
	// Workspaces holds the workspace of every context and isolated run;
	// nil makes a temporary root that Close removes.
	Workspaces *workspace.Root
	// Pip's index and find-links for packages installed into contexts
	// (PIP_INDEX_URL, PIP_FIND_LINKS); PipNoIndex uses find-links only.
	PipIndexURL  string
	PipFindLinks []string
	PipNoIndex   bool
	// MaxKernelFrame bounds one message a kernel sends, all its frames
	// together (0: the jupyter package's default); a kernel sending a
	// larger one, other than output (which is cut), is stopped.
	MaxKernelFrame int64

	// Store keeps the kernels, contexts, Jupyter sessions and runs for a
	// gateway started again on it (Restore); nil keeps them in memory
	// only. The provisioner should then launch kernels that outlive the
	// gateway (local.Provisioner.Detached).
	Store state.Store
	// CheckpointInterval is how far a kernel's last activity may run
	// ahead of its record in the Store before it is written again (what
	// cull timers restart from after a crash), and how long the
	// checkpoint gathers writes; idle kernels write nothing and wake
	// nothing.
	CheckpointInterval time.Duration
	// Ownership is the leases this replica holds when several gateways
	// serve one store (nil: a single gateway).
	Ownership Ownership
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		DefaultKernel:      "python3",
		StartTimeout:       60 * time.Second,
		RestartLimit:       5,
		RestartWindow:      time.Minute,
		HeartbeatTimeout:   30 * time.Second,
		HeartbeatPeriod:    jupyter.DefaultHeartbeatPeriod,
		CullInterval:       5 * time.Minute,
		ReplayMessages:     2000,
		ReplayBytes:        8 << 20,
		ClientMessages:     10000,
		ClientBytes:        64 << 20,
		Languages:          map[string]string{"python": "python3", "javascript": "deno", "typescript": "deno", "r": "ir"},
		OptionalLanguages:  []string{"r"},
		QueueLimit:         64,
		RunLimits:          runs.Limits{LogBytes: 8 << 20, ResultBytes: 32 << 20},
		RunRetention:       10 * time.Minute,
		RunsKept:           1000,
		RunBytes:           512 << 20,
		InterruptGrace:     3 * time.Second,
		PoolSize:           1,
		PoolMax:            4,
		PoolIdle:           30 * time.Second,
		LateOutputWait:     20 * time.Millisecond,
		LateOutputKernels:  []string{"Deno kernel"},
		CheckpointInterval: 30 * time.Second,
	}
}

func (c *Config) fill() {
	d := DefaultConfig()
	if c.DefaultKernel == "" {
		c.DefaultKernel = d.DefaultKernel
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = d.StartTimeout
	}
	if c.RestartLimit <= 0 {
		c.RestartLimit = d.RestartLimit
	}
	if c.RestartWindow <= 0 {
		c.RestartWindow = d.RestartWindow
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = d.HeartbeatTimeout
	}
	if c.HeartbeatPeriod <= 0 {
		c.HeartbeatPeriod = d.HeartbeatPeriod
	}
	if c.CullInterval <= 0 {
		c.CullInterval = d.CullInterval
	}
	if c.CheckpointInterval <= 0 {
		c.CheckpointInterval = d.CheckpointInterval
	}
	if c.ReplayMessages <= 0 {
		c.ReplayMessages = d.ReplayMessages
	}
	if c.ReplayBytes <= 0 {
		c.ReplayBytes = d.ReplayBytes
	}
	if c.ClientMessages <= 0 {
		c.ClientMessages = d.ClientMessages
	}
	if c.ClientBytes <= 0 {
		c.ClientBytes = d.ClientBytes
	}
	if c.Languages == nil {
		c.Languages = d.Languages
		if c.OptionalLanguages == nil {
			c.OptionalLanguages = d.OptionalLanguages
		}
	}
	if c.QueueLimit <= 0 {
		c.QueueLimit = d.QueueLimit
	}
	if c.RunLimits.LogBytes <= 0 {
		c.RunLimits.LogBytes = d.RunLimits.LogBytes
	}
	if c.RunLimits.ResultBytes <= 0 {
		c.RunLimits.ResultBytes = d.RunLimits.ResultBytes
	}
	if c.RunRetention <= 0 {
		c.RunRetention = d.RunRetention
	}
	if c.RunsKept <= 0 {
		c.RunsKept = d.RunsKept
	}
	if c.RunBytes <= 0 {
		c.RunBytes = d.RunBytes
	}
	if c.InterruptGrace <= 0 {
		c.InterruptGrace = d.InterruptGrace
	}
	if c.PoolSize < 0 {
		c.PoolSize = 0
	}
	if c.PoolMax <= 0 {
		c.PoolMax = d.PoolMax
	}
	c.PoolMax = max(c.PoolMax, c.PoolSize)
	if c.PoolIdle <= 0 {
		c.PoolIdle = d.PoolIdle
	}
	if c.LateOutputWait == 0 {
		c.LateOutputWait = d.LateOutputWait
	}
	if c.LateOutputKernels == nil {
		c.LateOutputKernels = d.LateOutputKernels
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
}

// Manager owns every kernel of the gateway.
type Manager struct {
	cfg     Config
	specs   *kernelspecs.Catalog
	prov    jupyter.Provisioner
	log     *slog.Logger
	session string // session id of the gateway's own messages
	started time.Time

	// start launches a kernel process: jupyter.Start with prov, or a
	// fake in tests; reconnect connects to one an earlier gateway
	// launched, and stopKept ends one without a client.
	start     starter
	reconnect reconnector
	stopKept  func(ctx context.Context, info jupyter.ProvisionerInfo) error
	// promptAdopt: see the constant.
	promptAdopt time.Duration
	// elsewhere: kernels left to the replicas of another host.
	elsewhere elsewhereKernels

	// store keeps the records (nil: memory only).
	store state.Store

	closing   chan struct{}
	closeOnce sync.Once
	// closingCtx ends when closing is closed: for the work that stops
	// when the manager starts closing.
	closingCtx    context.Context
	cancelClosing context.CancelFunc
	// records keeps the kernels and contexts in the store.
	records *records
	wg      sync.WaitGroup

	// runs are the code-interpreter's runs by id; journal writes them
	// to the store (nil without one).
	runs    *runs.Table
	journal *runs.Journal

	mu       sync.Mutex
	kernels  map[string]*Kernel
	contexts map[string]*Context
	// pooled counts the warm pools' kernels (starting or ready), stopping
	// the kernels forgotten whose processes are still being stopped: with
	// the kernels, all count toward MaxKernels. room is closed (and
	// replaced) whenever a place is freed.
	pooled, stopping int
	room             chan struct{}
	closed           bool
	// langVersions: the language version kernels of a spec reported.
	langVersions map[string]string
	// claiming are the shared contexts being claimed among replicas
	// (cluster_shared.go), each closed once its claim is decided.
	claiming map[string]chan struct{}

	wsRoot  *workspace.Root
	catalog *Catalog
	// jsessions are the Jupyter sessions.
	jsessions *JupyterSessions
	// warm are the warm pools.
	warm    *WarmPools
	wsOwned bool // a temporary root, removed by Close

	// handing is the replica's handover of its kernels (handover.go).
	handing handing
}

// New returns a manager of kernels started from specs with prov.
func New(cfg Config, specs *kernelspecs.Catalog, prov jupyter.Provisioner, log *slog.Logger) *Manager {
	cfg.fill()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{
		cfg: cfg, specs: specs, prov: prov, log: log,
		session:  uuid.NewString(),
		started:  time.Now(),
		closing:  make(chan struct{}),
		kernels:  make(map[string]*Kernel),
		contexts: make(map[string]*Context),
		room:     make(chan struct{}),

		langVersions: make(map[string]string),
	}
	m.closingCtx, m.cancelClosing = context.WithCancel(context.Background())
	m.openWorkspaces()
	m.records = &records{store: cfg.Store, writer: m.writer, log: log, cfg: &m.cfg, active: make(chan struct{}, 1)}
	m.warm = &WarmPools{m: m, bySpec: map[string]*pool{}}
	m.jsessions = &JupyterSessions{m: m, byID: map[string]*Session{}}
	m.catalog = &Catalog{cfg: &m.cfg, specs: specs, wsRoot: m.wsRoot}
	m.start = startJupyter(prov)
	m.reconnect = reconnectJupyter(prov)
	m.promptAdopt = promptAdopt
	m.stopKept = func(ctx context.Context, info jupyter.ProvisionerInfo) error {
		return jupyter.Stop(ctx, prov, info, 2*time.Second)
	}
	if cfg.Store != nil {
		m.store = cfg.Store
		m.journal = runs.NewJournal(cfg.Store, log)
		if cfg.Ownership != nil {
			m.journal.Fence(func(kernel string) runs.Store { return m.writer(kernel) })
		}
		m.goroutine(func() { m.records.checkpoint(m.closing, m.Kernels) })
		m.goroutine(func() { m.journal.Run(m.closingCtx) })
	}
	m.runs = runs.NewTable(runs.TableConfig{Limits: cfg.RunLimits, Kept: cfg.RunsKept, Bytes: cfg.RunBytes,
		Retention: cfg.RunRetention, Observer: cfg.Observer, Journal: m.journal})
	if cfg.CullIdleTimeout > 0 {
		m.goroutine(m.cull)
	}
	return m
}

// goroutine runs fn as a goroutine that Close waits for.
func (m *Manager) goroutine(fn func()) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		fn()
	}()
}

// Specs is the kernelspec catalog.
func (cat *Catalog) Specs() *kernelspecs.Catalog { return cat.specs }

// DefaultKernel is the kernelspec used when none is named.
func (cat *Catalog) DefaultKernel() string {
	if _, err := cat.specs.Get(cat.cfg.DefaultKernel); err == nil {
		return cat.cfg.DefaultKernel
	}
	if names := cat.specs.Names(); len(names) > 0 {
		return names[0]
	}
	return cat.cfg.DefaultKernel
}

// Spec returns the named kernelspec ("" is the default one).
func (cat *Catalog) Spec(name string) (*kernelspecs.Spec, error) {
	if name == "" {
		name = cat.DefaultKernel()
	}
	s, err := cat.specs.Get(name)
	if err != nil {
		return nil, errorf(ErrNoSuchSpec, "no kernelspec named %q; available: %s", name, strings.Join(cat.specs.Names(), ", "))
	}
	return s, nil
}

// StartOptions say which kernel to start.
type StartOptions struct {
	// Name is the kernelspec; "" means the default.
	Name string
	// ID is a kernel id chosen by the client (a UUID); an id in use
	// returns that kernel.
	ID string
	// Env comes from the client: only KERNEL_* and the configured names
	// are kept; KERNEL_WORKING_DIR, when it names a directory, becomes the
	// working directory.
	Env map[string]string
}

// MaxEnvValue bounds the length of an environment value from a client.
const MaxEnvValue = 4096

// filterEnv keeps the allowed variables of a kernel-create request.
func (cat *Catalog) filterEnv(env map[string]string) (map[string]string, string, error) {
	out := map[string]string{}
	cwd := ""
	for k, v := range env {
		if !strings.HasPrefix(k, "KERNEL_") && !contains(cat.cfg.EnvAllow, k) {
			continue
		}
		out[k] = v
	}
	if err := checkEnv(out); err != nil {
		return nil, "", err
	}
	if dir := out["KERNEL_WORKING_DIR"]; dir != "" {
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() && cat.checkCwd(dir) == nil {
			cwd = dir
		}
	}
	return out, cwd, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// StartKernel starts a kernel and returns once it is ready.
func (m *Manager) StartKernel(ctx context.Context, o StartOptions) (*Kernel, error) {
	spec, err := m.catalog.Spec(o.Name)
	if err != nil {
		return nil, err
	}
	id := o.ID
	if id != "" {
		if u, err := uuid.Parse(id); err != nil || u.String() != id || u.Version() != 4 {
			return nil, errorf(ErrBadRequest, "kernel_id must be a version 4 UUID in its canonical lowercase form")
		}
		if k, err := m.Kernel(id); err == nil {
			return k, nil
		}
	} else {
		id = uuid.NewString()
	}
	env, cwd, err := m.catalog.filterEnv(o.Env)
	if err != nil {
		return nil, err
	}
	return m.startKernel(ctx, id, spec, env, workDir{cwd: cwd}, restartNow)
}

func (m *Manager) startKernel(ctx context.Context, id string, spec *kernelspecs.Spec, env map[string]string, wd workDir, policy restartPolicy) (*Kernel, error) {
	held := m.holds(id)
	k, err := m.newKernel(id, spec, env, wd, policy)
	if err != nil {
		return nil, err
	}
	if err := m.reserve(ctx, k); err != nil {
		if !held {
			// The lease newKernel took for a kernel that never ran.
			m.disown(ctx, id)
		}
		return nil, err
	}
	k.life.Lock()
	err = k.launch(ctx)
	k.life.Unlock()
	if err != nil {
		m.stopKernel(context.Background(), k)
		return nil, err
	}
	m.log.Info("kernel started", "kernel", id, "spec", spec.Name, "took", time.Since(k.created).Round(time.Millisecond))
	return k, nil
}

// Kernel returns the kernel with id.
func (m *Manager) Kernel(id string) (*Kernel, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k, ok := m.kernels[id]
	if !ok {
		if err := m.movedError("kernel:"+id, "kernel "+id); err != nil {
			return nil, err
		}
		return nil, errorf(ErrNoSuchKernel, "Kernel does not exist: %s", id)
	}
	return k, nil
}

// Kernels lists the kernels, oldest first.
func (m *Manager) Kernels() []*Kernel {
	m.mu.Lock()
	ks := make([]*Kernel, 0, len(m.kernels))
	for _, k := range m.kernels {
		ks = append(ks, k)
	}
	m.mu.Unlock()
	sort.Slice(ks, func(i, j int) bool { return ks[i].created.Before(ks[j].created) })
	return ks
}

// ShutdownKernel stops a kernel and forgets it.
func (m *Manager) ShutdownKernel(ctx context.Context, id string) error {
	k, err := m.Kernel(id)
	if err != nil {
		return err
	}
	m.stopKernel(ctx, k)
	m.log.Info("kernel shut down", "kernel", id)
	return nil
}

// Status is the gateway's /api/status.
type Status struct {
	Started      string `json:"started"`
	LastActivity string `json:"last_activity"`
	Kernels      int    `json:"kernels"`
	Connections  int    `json:"connections"`
	// Replica is this replica's advertised URL and Replicas the live
	// ones', when several gateways serve one store (omitted otherwise).
	Replica  string   `json:"replica,omitempty"`
	Replicas []string `json:"replicas,omitempty"`
}

// Status reports the kernels, connections and latest activity.
func (m *Manager) Status() Status {
	last := m.started
	conns := 0
	ks := m.Kernels()
	for _, k := range ks {
		k.mu.Lock()
		if k.lastAct.After(last) {
			last = k.lastAct
		}
		conns += len(k.clients)
		k.mu.Unlock()
	}
	st := Status{Started: timefmt.Format(m.started), LastActivity: timefmt.Format(last), Kernels: len(ks), Connections: conns}
	if o := m.cfg.Ownership; o != nil {
		st.Replica, st.Replicas = o.URL(), o.Replicas()
	}
	return st
}

// cull shuts down idle kernels.
func (m *Manager) cull() {
	t := time.NewTicker(m.cfg.CullInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			m.CullOnce()
		case <-m.closing:
			return
		}
	}
}

// CullOnce shuts down the kernels idle past the timeout, now.
func (m *Manager) CullOnce() {
	for _, k := range m.Kernels() {
		if !k.cullable(&m.cfg) {
			continue
		}
		m.log.Info("culling idle kernel", "kernel", k.id, "spec", k.spec.Name)
		m.cfg.Observer.KernelCulled(k.spec.Name)
		m.ShutdownKernel(context.Background(), k.id)
	}
}

// Close shuts every kernel down and waits for the manager's goroutines.
// With a store, contexts and their workspaces are kept for the next
// start (their kernels are gone: their next run says the state was lost);
// without one they are deleted.
func (m *Manager) Close(ctx context.Context) error {
	m.close(ctx, false)
	return nil
}

// Detach closes the manager like Close but leaves every kernel running
// and recorded in the store, for the next gateway on the same store to
// adopt (kernelgate --keep-kernels). Runs still running are left to it:
// it picks them up. Warm-pool kernels and isolated runs end.
func (m *Manager) Detach(ctx context.Context) error {
	m.close(ctx, m.store != nil)
	return nil
}

func (m *Manager) close(ctx context.Context, keep bool) {
	m.closeOnce.Do(func() {
		m.mu.Lock()
		m.closed = true
		ks := make([]*Kernel, 0, len(m.kernels))
		for _, k := range m.kernels {
			ks = append(ks, k)
		}
		m.kernels = map[string]*Kernel{}
		ctxs := make([]*Context, 0, len(m.contexts))
		for _, c := range m.contexts {
			ctxs = append(ctxs, c)
		}
		m.mu.Unlock()
		pools := m.warm.close()
		close(m.closing)
		m.cancelClosing()
		// Every kernel stops at once, in parallel: each shutdown is
		// bounded, so the whole is.
		var wg sync.WaitGroup
		for _, c := range ctxs {
			// Commands are this process's children: none is handed over.
			c.stopCommands("the gateway stopped during the command")
			if m.store != nil && !c.Isolated {
				c.stopRuns(keep)
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				m.deleteContext(ctx, c, true)
			}()
		}
		for _, p := range pools {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.drain(ctx)
			}()
		}
		if keep {
			m.runs.Freeze()
		}
		for _, k := range ks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if keep {
					k.leave()
				} else {
					k.shutdown(ctx)
				}
			}()
		}
		wg.Wait()
		m.wg.Wait()
		if m.store != nil {
			if err := m.journal.WriteBehind(ctx); err != nil {
				m.log.Error("state: run records the store was behind on were not written", "err", err)
			}
			if err := m.store.Flush(ctx); err != nil {
				m.log.Error("state: the last run records were not written", "err", err)
			}
		}
		m.closeWorkspaces()
	})
}

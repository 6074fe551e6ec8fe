package sessions

import (
	"context"
	"errors"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
	"kernelgate/provision/local"
	"kernelgate/workspace"
)

func newID() string { return uuid.NewString() }

// newRunID is the id of a new run: a UUID whose leading bits are its
// time (version 7), so that the store adds the records of new runs, and
// prunes those of the oldest, at the two ends of its keys instead of all
// over them (a random key dirtied a page of each of the store's trees per
// run and commit).
func newRunID() string {
	if id, err := uuid.NewV7(); err == nil {
		return id.String()
	}
	return newID()
}

// contextID is what a client may name a context.
var contextID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// sharedID is the context id of a language's shared kernel.
func sharedID(language string) string { return "code-" + language }

// checkContextID refuses an id a client may not give a context of
// choice: one that is not 1 to 128 of A-Z a-z 0-9 . _ -, "." and ".."
// (which clients that normalise URLs cannot reach), and the id of another
// shared kernel (whose default runs would go to this one).
func (m *Manager) checkContextID(id string, choice kernelChoice) error {
	if !contextID.MatchString(id) || id == "." || id == ".." {
		return errorf(ErrBadRequest, "a context id has 1 to 128 of A-Z a-z 0-9 . _ - and is not . or ..")
	}
	if id == choice.shared {
		return nil
	}
	if lang, ok := strings.CutPrefix(id, "code-"); ok {
		if _, configured := m.cfg.Languages[lang]; configured {
			return errorf(ErrBadRequest, "context id %s is the shared %s kernel's: create it with language %s, or choose another id", id, lang, lang)
		}
	}
	if name, ok := strings.CutPrefix(id, sharedSpecPrefix); ok {
		if _, err := m.specs.Get(name); err == nil {
			return errorf(ErrBadRequest, "context id %s is the shared kernel of kernelspec %s: create it with kernelspec %s, or choose another id", id, name, name)
		}
	}
	return nil
}

// Languages lists the languages whose kernelspec is available.
func (m *Manager) Languages() []string {
	var out []string
	for lang, spec := range m.cfg.Languages {
		if _, err := m.specs.Get(spec); err == nil {
			out = append(out, lang)
		}
	}
	sort.Strings(out)
	return out
}

// defaultLanguage is the language of requests that name none.
const defaultLanguage = "python"

// requestSpec returns the language of a request (the default when it names
// none) and its kernelspec.
func (m *Manager) requestSpec(language string) (string, *kernelspecs.Spec, error) {
	if language == "" {
		language = defaultLanguage
	}
	spec, err := m.languageSpec(language)
	return language, spec, err
}

// languageSpec returns the kernelspec of a language.
func (m *Manager) languageSpec(language string) (*kernelspecs.Spec, error) {
	name, ok := m.cfg.Languages[language]
	if ok {
		if s, err := m.specs.Get(name); err == nil {
			return s, nil
		}
	}
	return nil, errorf(ErrInvalidLanguage, "language %q is not available; available: %s", language, strings.Join(m.Languages(), ", "))
}

// checkEnv validates caller-supplied variables.
func checkEnv(env map[string]string) error {
	if err := local.ValidateEnv(env); err != nil {
		return &Error{Kind: ErrInvalidEnv, Msg: err.Error()}
	}
	return nil
}

// ContextRequest creates a context.
type ContextRequest struct {
	ID       string
	Language string
	// Kernelspec names the kernelspec of the context's kernel, instead of
	// or beside Language (chooseKernel).
	Kernelspec string
	// Cwd is the kernel's working directory inside the context's
	// workspace: relative to it, or absolute inside it; made when missing.
	Cwd string
	Env map[string]string
	// Packages are installed into the context before CreateContext
	// returns: pip requirements for Python, npm:/jsr: specifiers for Deno.
	Packages []string
	// Workspace, when set, is a workspace the context shares (made with
	// CreateWorkspace: several contexts of one sandbox of an adapter); it
	// is not deleted with the context. Nil gives the context its own.
	Workspace *workspace.Workspace
}

// CreateContext creates a context and starts its kernel.
func (m *Manager) CreateContext(ctx context.Context, req ContextRequest) (*Context, error) {
	choice, err := m.chooseKernel(req.Language, req.Kernelspec)
	if err != nil {
		return nil, err
	}
	spec := choice.spec
	req.Language = choice.language
	if req.ID == "" {
		req.ID = newID()
	} else if err := m.checkContextID(req.ID, choice); err != nil {
		return nil, err
	}
	if err := checkEnv(req.Env); err != nil {
		return nil, err
	}
	if err := checkPackages(spec, req.Packages); err != nil {
		return nil, err
	}
	if _, err := m.Context(req.ID); err == nil {
		return nil, errorf(ErrNameConflict, "context id %q is in use", req.ID)
	}
	ws, borrowed := req.Workspace, req.Workspace != nil
	release := func() {
		if !borrowed {
			ws.Close()
		}
	}
	if !borrowed {
		if ws, err = m.newWorkspace(contextWorkspace(req.ID), spec); err != nil {
			return nil, err
		}
	}
	cwd, err := resolveCwd(ws, req.Cwd)
	if err != nil {
		release()
		return nil, err
	}
	c := &Context{ID: req.ID, Language: req.Language, Cwd: cwd, Env: req.Env, m: m, spec: spec, ws: ws, wsBorrowed: borrowed, created: time.Now()}
	if err := m.addContext(c); err != nil {
		release() // another context of this id owns the folder
		return nil, err
	}
	if _, _, err := c.ensureKernel(ctx); err != nil {
		m.deleteContext(context.Background(), c, false)
		return nil, err
	}
	if err := c.installPackages(ctx, req.Packages); err != nil {
		m.deleteContext(context.Background(), c, false)
		return nil, err
	}
	return c, nil // recorded by ensureKernel, with its kernel
}

func (m *Manager) addContext(c *Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrShuttingDown
	}
	if _, taken := m.contexts[c.ID]; taken {
		return errorf(ErrNameConflict, "context id %q is in use", c.ID)
	}
	m.contexts[c.ID] = c
	return nil
}

// Context returns a context by id.
func (m *Manager) Context(id string) (*Context, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.contexts[id]
	if !ok || c.Isolated {
		return nil, errorf(ErrNoSuchContext, "no context %q: create it with POST /api/contexts", id)
	}
	return c, nil
}

// Contexts lists the contexts, shared kernels that have run included,
// oldest first.
func (m *Manager) Contexts() []*Context {
	m.mu.Lock()
	out := make([]*Context, 0, len(m.contexts))
	for _, c := range m.contexts {
		if !c.Isolated {
			out = append(out, c)
		}
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].created.Before(out[j].created) })
	return out
}

// DeleteContext shuts a context's kernel down and forgets it.
func (m *Manager) DeleteContext(ctx context.Context, id string) error {
	c, err := m.Context(id)
	if err != nil {
		return err
	}
	m.deleteContext(ctx, c, false)
	return nil
}

// deleteContext forgets c and shuts its kernel down (at once once ctx
// ends); stopping says the gateway is stopping, which its runs are told.
func (m *Manager) deleteContext(ctx context.Context, c *Context, stopping bool) {
	m.mu.Lock()
	mine := m.contexts[c.ID] == c
	if mine {
		delete(m.contexts, c.ID)
	}
	m.mu.Unlock()
	if mine {
		m.deleteContextRecord(c)
	}
	c.mu.Lock()
	already := c.deleted
	c.deleted = true
	k := c.kernel
	queued := c.queue
	c.queue = nil
	running := c.running
	c.mu.Unlock()
	before, during := deletedBeforeStart(c), "context "+c.ID+" was deleted during the run and its kernel shut down"
	if stopping {
		before, during = stoppedBeforeStart, "the gateway stopped during the run and shut its kernel down"
	}
	for _, r := range queued {
		r.lose(before)
	}
	c.stopCommands(during)
	// The running run ends first: the kernel's shutdown would end it
	// without saying why.
	if running != nil {
		running.lose(during)
	}
	if k != nil {
		m.stopKernel(ctx, k)
	}
	if !already {
		m.deleteWorkspace(c)
	}
}

// InterruptContext interrupts what a context is running.
func (m *Manager) InterruptContext(ctx context.Context, id string) error {
	c, err := m.Context(id)
	if err != nil {
		return err
	}
	return c.interrupt(ctx)
}

// RestartContext gives a context a fresh kernel; the id stays.
func (m *Manager) RestartContext(ctx context.Context, id string) (*Context, error) {
	c, err := m.Context(id)
	if err != nil {
		return nil, err
	}
	return c, c.restart(ctx)
}

// ExecuteRequest is POST /api/execute.
type ExecuteRequest struct {
	Code     string
	Language string
	// Kernelspec names the kernelspec to run on, instead of or beside
	// Language (chooseKernel).
	Kernelspec string
	Context    string
	Isolated   bool
	Cwd        string
	Env        map[string]string // nil: not given
	Timeout    time.Duration     // 0: no limit; at most MaxRunTimeout
	Stdin      bool
	// Wait says the caller waits for the run's end (a POST /api/execute
	// that is not streamed). On an idle context the run then runs on the
	// caller's goroutine, and Execute returns once it has ended: one
	// hand-off less each way. The run still ends the same way if the
	// caller's client goes away.
	Wait bool
}

// Execute queues a run and returns it; it runs in the background and
// outlives the caller. Isolated runs get their kernel before Execute
// returns (REQUEST_TIMEOUT when the timeout ends first).
func (m *Manager) Execute(ctx context.Context, req ExecuteRequest) (*Run, error) {
	if req.Isolated && req.Context != "" {
		return nil, errorf(ErrBadRequest, "isolated runs get a fresh kernel: do not name a context")
	}
	if req.Context != "" && req.Env != nil {
		return nil, errorf(ErrBadRequest, "env applies when a kernel starts: set it when creating the context")
	}
	if strings.ContainsRune(req.Code, 0) {
		return nil, errorf(ErrBadRequest, nulInCode)
	}
	if err := checkEnv(req.Env); err != nil {
		return nil, err
	}
	if req.Timeout < 0 || req.Timeout > MaxRunTimeout {
		return nil, errorf(ErrBadRequest, "%s", TimeoutRange)
	}
	var c *Context
	var err error
	switch {
	case req.Context != "":
		if c, err = m.Context(req.Context); err != nil {
			return nil, err
		}
		if req.Language != "" && req.Language != c.Language {
			return nil, errorf(ErrBadRequest, "context %s runs %s, not %s", c.ID, c.Language, req.Language)
		}
		if req.Kernelspec != "" && req.Kernelspec != c.spec.Name {
			return nil, errorf(ErrBadRequest, "context %s runs kernelspec %s, not %s", c.ID, c.spec.Name, req.Kernelspec)
		}
	case req.Isolated:
		return m.executeIsolated(ctx, req)
	default:
		if c, err = m.sharedContext(req); err != nil {
			return nil, err
		}
	}
	r := m.newRun(c, req)
	inline, first, err := c.enqueueRun(r, req.Wait)
	if err != nil {
		m.dropRun(r, err)
		return nil, err
	}
	if !first && !req.Wait {
		// It waits behind another run: its record is committed now,
		// before its id is handed out. (The next run to go is committed
		// as its code is sent, or before it waits for its kernel.) A
		// run its caller waits for hands its id out with its end only.
		r.promise()
	}
	if inline {
		c.workInline()
	} else if !req.Wait {
		r.awaitDurable(ctx)
	}
	return r, nil
}

// sharedContext returns the shared context of the request's language (or
// kernelspec), creating it with the request's cwd and env on first use.
func (m *Manager) sharedContext(req ExecuteRequest) (*Context, error) {
	choice, err := m.chooseKernel(req.Language, req.Kernelspec)
	if err != nil {
		return nil, err
	}
	lang, spec, id := choice.language, choice.spec, choice.shared
	existing := func() (*Context, bool, error) {
		if m.closed {
			return nil, false, ErrShuttingDown
		}
		c, ok := m.contexts[id]
		if ok && req.Env != nil && !sameEnv(req.Env, c.Env) {
			return nil, false, errorf(ErrUnsupported, "the shared kernel %s was started with another env; create a context for this env", id)
		}
		return c, ok, nil
	}
	m.mu.Lock()
	c, ok, err := existing()
	m.mu.Unlock()
	if ok || err != nil {
		return c, err
	}
	// The first run makes the workspace (outside the lock: it is disk work).
	ws, err := m.newWorkspace(contextWorkspace(id), spec)
	if err != nil {
		return nil, err
	}
	cwd, err := resolveCwd(ws, req.Cwd)
	if err != nil {
		ws.Close()
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok, err := existing(); ok || err != nil {
		ws.Close() // the same folder, opened by the run that came first
		return c, err
	}
	c = &Context{ID: id, Language: lang, Cwd: cwd, Env: req.Env, Shared: true, m: m, spec: spec, ws: ws, created: time.Now()}
	m.contexts[id] = c
	return c, nil
}

func sameEnv(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// executeIsolated runs code on a kernel of its own, from the warm pool when
// one is ready, deleted after the run.
func (m *Manager) executeIsolated(ctx context.Context, req ExecuteRequest) (*Run, error) {
	choice, err := m.chooseKernel(req.Language, req.Kernelspec)
	if err != nil {
		return nil, err
	}
	lang, spec := choice.language, choice.spec
	runID := newRunID()
	c := &Context{ID: "isolated-" + runID, Language: lang, Env: req.Env, Isolated: true, m: m, spec: spec, created: time.Now()}
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.Timeout)
		defer cancel()
	}
	// A pooled kernel comes with a fresh workspace of its own, already its
	// cwd; the run's cwd and env are applied by code.
	_, canSetup := setupCode(spec, "", req.Env)
	var k *Kernel
	if canSetup {
		if p := m.pool(spec); p != nil {
			if k = p.take(); k != nil {
				c.pool = p
			}
		}
	}
	if k != nil {
		// take moved the kernel (and its place under MaxKernels) from
		// the pool to the manager's kernels.
		c.ws = k.ws
		fail := func(err error) (*Run, error) {
			m.stopKernel(context.Background(), k)
			c.ws.Delete()
			return nil, err
		}
		cwd, err := resolveCwd(c.ws, req.Cwd)
		if err != nil {
			return fail(err)
		}
		c.Cwd = cwd
		if cwd == c.ws.Dir() {
			cwd = ""
		}
		if setup, _ := setupCode(spec, cwd, req.Env); setup != "" {
			if err := runSetup(ctx, k, setup); err != nil {
				return fail(err)
			}
		}
	} else {
		ws, err := m.newWorkspace(runWorkspace(runID), spec)
		if err != nil {
			return nil, err
		}
		c.ws = ws
		if c.Cwd, err = resolveCwd(ws, req.Cwd); err != nil {
			ws.Delete()
			return nil, err
		}
		k, err = m.startKernel(ctx, newID(), spec, req.Env, workDir{ws: ws, cwd: c.Cwd}, restartLazily)
		if err != nil {
			ws.Delete()
			if ctx.Err() != nil || errors.Is(err, ErrStartTimeout) {
				return nil, errorf(ErrStartTimeout, "the timeout ran out before the isolated kernel started; raise timeout")
			}
			return nil, err
		}
	}
	c.kernel = k
	m.mu.Lock()
	m.contexts[c.ID] = c
	m.mu.Unlock()
	r := m.newRunWithID(runID, c, req)
	if err := c.enqueue(r); err != nil {
		m.dropRun(r, err)
		m.deleteContext(context.Background(), c, false)
		return nil, err
	}
	if !req.Wait {
		r.awaitDurable(ctx)
	}
	return r, nil
}

// runSetup applies an isolated run's cwd and env in a pooled kernel.
func runSetup(ctx context.Context, k *Kernel, code string) error {
	jk, err := k.running(ctx)
	if err != nil {
		return err
	}
	content := jupyter.NewExecute(code)
	content.Silent, content.StoreHistory = true, false
	call, err := startExecute(jk, content, nil)
	if err != nil {
		return err
	}
	reply, err := call.Wait(ctx)
	if err != nil {
		jk.Forget(call)
		if ctx.Err() != nil {
			return errorf(ErrStartTimeout, "the timeout ran out while the isolated kernel was being prepared")
		}
		return err
	}
	var s struct {
		Status, EValue string
	}
	reply.DecodeContent(&s)
	if s.Status != "ok" {
		return errorf(ErrBadRequest, "cwd or env could not be applied: %s", s.EValue)
	}
	return nil
}

// pool returns the warm pool of a kernelspec, or nil when pools are off.
func (m *Manager) pool(spec *kernelspecs.Spec) *pool {
	if m.cfg.PoolSize <= 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	p, ok := m.pools[spec.Name]
	if !ok {
		p = &pool{m: m, spec: spec, floor: m.cfg.PoolSize, ceiling: m.cfg.PoolMax, idle: m.cfg.PoolIdle}
		m.pools[spec.Name] = p
	}
	return p
}

// Prewarm fills the warm pools of the given languages now.
func (m *Manager) Prewarm(languages []string) error {
	for _, lang := range languages {
		spec, err := m.languageSpec(lang)
		if err != nil {
			return err
		}
		if p := m.pool(spec); p != nil {
			p.refill()
		}
	}
	return nil
}

// Pools reports the warm pools.
func (m *Manager) Pools() []PoolStats {
	m.mu.Lock()
	ps := make([]*pool, 0, len(m.pools))
	for _, p := range m.pools {
		ps = append(ps, p)
	}
	m.mu.Unlock()
	out := make([]PoolStats, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.stats())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Spec < out[j].Spec })
	return out
}

func (m *Manager) newRun(c *Context, req ExecuteRequest) *Run {
	return m.newRunWithID(newRunID(), c, req)
}

func (m *Manager) newRunWithID(id string, c *Context, req ExecuteRequest) *Run {
	r := newRun(id, c.ID, c.Language, req.Code, req.Stdin, req.Timeout, m.cfg.RunLimits)
	r.b.displayResults = displayResults(c.spec)
	r.observer = m.cfg.Observer
	r.onEnd = m.runEnded
	r.wait = req.Wait
	if m.store != nil {
		r.ps = &runStore{m: m}
	} else {
		r.madeDurable()
	}
	m.mu.Lock()
	pruned := m.pruneRunsLocked()
	m.runs[id] = r
	m.runOrder = append(m.runOrder, r)
	m.mu.Unlock()
	m.deleteRuns(pruned)
	return r
}

// dropRun forgets a run its queue refused, and ends it: nothing waits for
// it, and no record of it is kept.
func (m *Manager) dropRun(r *Run, why error) {
	m.mu.Lock()
	if m.runs[r.ID] == r {
		delete(m.runs, r.ID)
		// It is the newest run, or close to it.
		for i := len(m.runOrder) - 1; i >= 0; i-- {
			if m.runOrder[i] == r {
				m.runOrder = append(m.runOrder[:i], m.runOrder[i+1:]...)
				break
			}
		}
	}
	m.mu.Unlock()
	r.refuse(why)
	m.deleteRuns([]*Run{r})
}

// runEnded counts a finished run's memory and prunes the records.
func (m *Manager) runEnded(r *Run) {
	size := r.memory()
	m.mu.Lock()
	if m.runs[r.ID] == r && !r.counted {
		r.counted = true
		m.runBytes += size
	}
	pruned := m.pruneRunsLocked()
	m.mu.Unlock()
	m.deleteRuns(pruned)
}

// pruneRunsLocked forgets the oldest finished runs while more than
// RunsKept runs or RunBytes of finished runs are kept, and those past the
// retention time. It goes from the oldest run and stops at the first
// finished run it keeps; runs still queued or running are passed over and
// kept whatever their age, so one long run does not hold back the pruning
// of those after it. It returns the runs pruned whose records the store
// keeps, for deleteRuns once m.mu is released.
func (m *Manager) pruneRunsLocked() (pruned []*Run) {
	now := time.Now()
	n := len(m.runOrder)
	kept := m.runOrder[:0:0]
	i := 0
	for ; i < len(m.runOrder); i++ {
		r := m.runOrder[i]
		r.mu.Lock()
		done, at, size := r.state == RunDone, r.finished, r.kept
		r.mu.Unlock()
		if !done {
			kept = append(kept, r)
			continue
		}
		if n <= m.cfg.RunsKept && m.runBytes <= m.cfg.RunBytes && now.Sub(at) <= m.cfg.RunRetention {
			break
		}
		delete(m.runs, r.ID)
		if m.store != nil {
			pruned = append(pruned, r)
		}
		if r.counted {
			m.runBytes -= size
		}
		n--
	}
	if n == len(m.runOrder) {
		return nil
	}
	// The unfinished runs passed over go right before the first run kept
	// after them, and the order starts there: the runs after it are not
	// copied (a copy of the whole order per run was O(RunsKept) under
	// m.mu); append reallocates once the front's room is used up.
	start := i - len(kept)
	copy(m.runOrder[start:i], kept)
	clear(m.runOrder[:start])
	m.runOrder = m.runOrder[start:]
	return pruned
}

// deletedBeforeStart says why a run queued on a deleted context ends.
func deletedBeforeStart(c *Context) string {
	return "context " + c.ID + " was deleted before the run started; it never ran"
}

// keptRuns returns the ids whose runs are still kept, in their order.
func (m *Manager) keptRuns(ids []string) []string {
	m.mu.Lock()
	pruned := m.pruneRunsLocked()
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		// A run whose record is not durable yet is not shown: its id
		// is handed out only once it is (promise). A run its caller
		// waits for is shown from memory: nothing of it is promised
		// while it runs.
		if r, ok := m.runs[id]; ok && (r.wait || r.isDurable()) {
			out = append(out, id)
		}
	}
	m.mu.Unlock()
	m.deleteRuns(pruned)
	return out
}

// Run returns a run by id.
func (m *Manager) Run(id string) (*Run, error) {
	m.mu.Lock()
	pruned := m.pruneRunsLocked()
	r, ok := m.runs[id]
	m.mu.Unlock()
	m.deleteRuns(pruned)
	if !ok {
		return nil, errorf(ErrNotFound, "no run %q (finished runs are kept for %v)", id, m.cfg.RunRetention)
	}
	return r, nil
}

// stoppedBeforeStart is what a run queued when the gateway stopped says.
const stoppedBeforeStart = "the gateway stopped before the run started; it never ran"

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
	"kernelgate/runs"
	"kernelgate/workspace"
)

func newID() string { return uuid.NewString() }

// contextID is what a client may name a context.
var contextID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// sharedID is the context id of a language's shared kernel.
func sharedID(language string) string { return "code-" + language }

// checkContextID refuses an id a client may not give a context of
// choice: one that is not 1 to 128 of A-Z a-z 0-9 . _ -, "." and ".."
// (which clients that normalise URLs cannot reach), and the id of another
// shared kernel (whose default runs would go to this one).
func (cat *Catalog) checkContextID(id string, choice kernelChoice) error {
	if !contextID.MatchString(id) || id == "." || id == ".." {
		return errorf(ErrBadRequest, "a context id has 1 to 128 of A-Z a-z 0-9 . _ - and is not . or ..")
	}
	if id == choice.shared {
		return nil
	}
	if lang, ok := strings.CutPrefix(id, "code-"); ok {
		if _, configured := cat.cfg.Languages[lang]; configured {
			return errorf(ErrBadRequest, "context id %s is the shared %s kernel's: create it with language %s, or choose another id", id, lang, lang)
		}
	}
	if name, ok := strings.CutPrefix(id, sharedSpecPrefix); ok {
		if _, err := cat.specs.Get(name); err == nil {
			return errorf(ErrBadRequest, "context id %s is the shared kernel of kernelspec %s: create it with kernelspec %s, or choose another id", id, name, name)
		}
	}
	return nil
}

// Languages lists the languages whose kernelspec is available.
func (cat *Catalog) Languages() []string {
	var out []string
	for lang, spec := range cat.cfg.Languages {
		if _, err := cat.specs.Get(spec); err == nil {
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
func (cat *Catalog) requestSpec(language string) (string, *kernelspecs.Spec, error) {
	if language == "" {
		language = defaultLanguage
	}
	spec, err := cat.languageSpec(language)
	return language, spec, err
}

// languageSpec returns the kernelspec of a language.
func (cat *Catalog) languageSpec(language string) (*kernelspecs.Spec, error) {
	name, ok := cat.cfg.Languages[language]
	if ok {
		if s, err := cat.specs.Get(name); err == nil {
			return s, nil
		}
	}
	return nil, errorf(ErrInvalidLanguage, "language %q is not available; available: %s", language, strings.Join(cat.Languages(), ", "))
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
	choice, err := m.catalog.chooseKernel(req.Language, req.Kernelspec)
	if err != nil {
		return nil, err
	}
	spec := choice.spec
	req.Language = choice.language
	if req.ID == "" {
		req.ID = newID()
	} else if err := m.catalog.checkContextID(req.ID, choice); err != nil {
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
	c.initRuns()
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
		if err := m.movedError("context:"+id, "context "+id); err != nil {
			return nil, err
		}
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
		m.records.deleteContext(c)
	}
	c.mu.Lock()
	already := c.deleted
	c.deleted = true
	k := c.kernel
	c.mu.Unlock()
	queued, running := c.runs.Close()
	before, during := deletedBeforeStart(c), "context "+c.ID+" was deleted during the run and its kernel shut down"
	if stopping {
		before, during = stoppedBeforeStart, "the gateway stopped during the run and shut its kernel down"
	}
	for _, r := range queued {
		r.Lose(before)
	}
	c.stopCommands(during)
	// The running run ends first: the kernel's shutdown would end it
	// without saying why.
	if running != nil {
		running.Lose(during)
	}
	if k != nil {
		m.stopKernel(ctx, k)
	}
	if !already {
		c.deleteWorkspace()
	}
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
	// Forwarded: another replica accepted and recorded the run (its id
	// is kept; a run of that id known here already is returned as it is).
	Forwarded Forwarded
}

// Execute queues a run and returns it; it runs in the background and
// outlives the caller. Isolated runs get their kernel before Execute
// returns (REQUEST_TIMEOUT when the timeout ends first).
func (m *Manager) Execute(ctx context.Context, req ExecuteRequest) (*runs.Run, error) {
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
	if err := m.acting(c.KernelID()); err != nil {
		return nil, err
	}
	r, existed, err := c.forwardedRun(req, req.Forwarded)
	if err != nil || existed {
		return r, err
	}
	inline, first, err := c.runs.EnqueueRun(r, req.Wait)
	if err != nil {
		m.runs.Drop(r, err)
		// A context whose kernel is being handed over takes no new
		// run: the request waits for the handover and goes on to the
		// new owner.
		return nil, holdForHandover(ctx, err)
	}
	if !first && !req.Wait {
		// It waits behind another run: its record is committed now,
		// before its id is handed out. (The next run to go is committed
		// as its code is sent, or before it waits for its kernel.)
		r.Promise()
	}
	if inline {
		m.wg.Add(1)
		c.runs.WorkInline()
		m.wg.Done()
	} else if !req.Wait {
		r.AwaitDurable(ctx)
	}
	return r, nil
}

// sharedContext returns the shared context of the request's language (or
// kernelspec), creating it with the request's cwd and env on first use.
func (m *Manager) sharedContext(req ExecuteRequest) (*Context, error) {
	choice, err := m.catalog.chooseKernel(req.Language, req.Kernelspec)
	if err != nil {
		return nil, err
	}
	if cl := m.claimer(); cl != nil {
		return m.clusterSharedContext(cl, req, choice)
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
	c.initRuns()
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
func (m *Manager) executeIsolated(ctx context.Context, req ExecuteRequest) (*runs.Run, error) {
	choice, err := m.catalog.chooseKernel(req.Language, req.Kernelspec)
	if err != nil {
		return nil, err
	}
	lang, spec := choice.language, choice.spec
	runID := runs.NewID()
	c := &Context{ID: "isolated-" + runID, Language: lang, Env: req.Env, Isolated: true, m: m, spec: spec, created: time.Now()}
	c.initRuns()
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
		if p := m.warm.get(spec); p != nil {
			if k = p.take(); k != nil {
				c.pool = p
			}
		}
	}
	if k != nil {
		// take moved the kernel (and its place under MaxKernels) from
		// the pool to the manager's kernels.
		c.ws = k.ws
		fail := func(err error) (*runs.Run, error) {
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
	r := c.newRun(runID, req)
	if err := c.runs.Enqueue(r); err != nil {
		m.runs.Drop(r, err)
		m.deleteContext(context.Background(), c, false)
		return nil, err
	}
	if !req.Wait {
		r.AwaitDurable(ctx)
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

// newRun makes a run of req on c, kept in the manager's runs; id "" is
// a new id.
func (c *Context) newRun(id string, req ExecuteRequest) *runs.Run {
	return c.m.runs.New(c.runSpec(id, req))
}

// runSpec is the spec of a run of req on c.
func (c *Context) runSpec(id string, req ExecuteRequest) runs.Spec {
	return runs.Spec{ID: id, Context: c.ID, Language: c.Language, Code: req.Code, Stdin: req.Stdin, Wait: req.Wait,
		Timeout: req.Timeout, DisplayResults: displayResults(c.spec)}
}

// deletedBeforeStart says why a run queued on a deleted context ends.
func deletedBeforeStart(c *Context) string {
	return "context " + c.ID + " was deleted before the run started; it never ran"
}

// Run returns a run by id.
func (m *Manager) Run(id string) (*runs.Run, error) { return m.runs.Get(id) }

// stoppedBeforeStart is what a run queued when the gateway stopped says.
const stoppedBeforeStart = "the gateway stopped before the run started; it never ran"

package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"sync"
	"time"

	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
	"kernelgate/runs"
	"kernelgate/workspace"

	"kernelgate/internal/timefmt"
)

// Context is an interpreter context of the code-interpreter API: a kernel
// whose state runs share, with a queue (runs.Queue) that runs them one at
// a time in arrival order. The context is the queue's Host: it hands the
// runs their kernel.
type Context struct {
	ID       string
	Language string
	Cwd      string
	Env      map[string]string
	Shared   bool // code-python, code-r, …, kernelspec-<name>
	Isolated bool // a one-run kernel, deleted after its run

	// pool gave an isolated context its kernel; it refills when the run ends.
	pool *pool
	// claimed is the id of the kernel a shared context claimed among
	// replicas was claimed for: its first kernel starts under it
	// (cluster_shared.go). Guarded by mu.
	claimed string
	// ws is the context's workspace; Cwd lies in it. Set before the
	// context is published, never changed.
	ws         *workspace.Workspace
	wsBorrowed bool // ws is shared (ContextRequest.Workspace): kept at delete
	// spare are the workspaces of pooled kernels the context took that
	// their kernel still uses (warm.go); deleted with the context.
	spare []*workspace.Workspace

	m       *Manager
	spec    *kernelspecs.Spec
	created time.Time
	// runs is its queue of runs; set before the context is published.
	runs *runs.Queue

	mu      sync.Mutex
	kernel  *Kernel
	deleted bool
	// commands are the commands running beside its kernel (commands.go).
	commands map[*runs.Run]*commandRun
	// tokens are the hashes of the context tokens minted for it
	// (KeepToken).
	tokens []ContextToken
}

// ContextModel is a context as the API shows it.
type ContextModel struct {
	ID              string   `json:"id"`
	Language        string   `json:"language"`
	Kernelspec      string   `json:"kernelspec"`
	Cwd             string   `json:"cwd"`
	Env             []string `json:"env"`
	Active          bool     `json:"active"`
	KernelID        *string  `json:"kernelId"`
	KernelProcessID *int     `json:"kernelProcessId"`
	ProcessIDs      []string `json:"processIds"`
	ExecutionState  string   `json:"executionState"`
	CreatedAt       string   `json:"createdAt"`
	LastActivity    string   `json:"lastActivity"`
	// Replica is the advertised URL of the replica that owns the
	// context's kernel, when several serve one store.
	Replica string `json:"replica,omitempty"`
}

// Model returns the context's model; active says whether its kernel is
// running now (if not, the next run starts one without the old state).
func (c *Context) Model() ContextModel {
	c.mu.Lock()
	k := c.kernel
	c.mu.Unlock()
	ids := c.m.runs.Kept(c.runs.RunIDs())
	names := make([]string, 0, len(c.Env))
	for n := range c.Env {
		names = append(names, n)
	}
	sort.Strings(names)
	cm := ContextModel{
		ID: c.ID, Language: c.Language, Kernelspec: c.spec.Name, Cwd: c.Cwd, Env: names, ProcessIDs: ids,
		ExecutionState: "dead", CreatedAt: timefmt.Format(c.created), LastActivity: timefmt.Format(c.created),
		Replica: c.m.replicaURL(),
	}
	if k != nil {
		km := k.Model()
		id := k.id
		cm.KernelID = &id
		cm.ExecutionState = km.ExecutionState
		cm.LastActivity = km.LastActivity
		if pid := k.PID(); pid > 0 {
			cm.Active = true
			cm.KernelProcessID = &pid
		}
		if k.Running() {
			cm.Active = true
		}
	}
	return cm
}

// kernelFor returns the context's kernel, starting one if it has none or
// its process is gone (a run after a death gets a fresh kernel).
func (c *Context) ensureKernel(ctx context.Context) (*Kernel, process, error) {
	c.mu.Lock()
	k := c.kernel
	c.mu.Unlock()
	if k != nil {
		jk, err := k.ensure(ctx)
		if err == nil {
			return k, jk, nil
		}
		if !errors.Is(err, ErrKernelGone) {
			return nil, nil, err
		}
	}
	// No kernel, or it was deleted through the Jupyter API: take a ready
	// one from the pool, or start another.
	// A shared context claimed among replicas starts the kernel its
	// claim names (cluster_shared.go).
	c.mu.Lock()
	id := c.claimed
	c.claimed = ""
	c.mu.Unlock()
	claimed := id != ""
	k = nil
	if !claimed {
		id = newID()
		k = c.takeWarm(ctx)
	}
	if k == nil {
		var err error
		if k, err = c.m.startKernel(ctx, id, c.spec, c.Env, workDir{ws: c.ws, cwd: c.Cwd}, restartLazily); err != nil {
			if claimed {
				c.mu.Lock()
				c.claimed = id
				c.mu.Unlock()
			}
			return nil, nil, err
		}
	}
	c.mu.Lock()
	if c.deleted {
		c.mu.Unlock()
		c.m.ShutdownKernel(context.Background(), k.id)
		return nil, nil, errorf(ErrNoSuchContext, "context %s was deleted", c.ID)
	}
	c.kernel = k
	c.mu.Unlock()
	c.m.records.putContext(c)
	jk, err := k.running(ctx)
	return k, jk, err
}

// kernelReady reports whether the context's kernel process is running and
// connected (not starting, restarting or being adopted).
func (c *Context) kernelReady() bool {
	c.mu.Lock()
	k := c.kernel
	c.mu.Unlock()
	if k == nil {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.jk != nil
}

// Interrupt interrupts what the context is running.
func (c *Context) Interrupt(ctx context.Context) error {
	running := c.runs.Running()
	c.mu.Lock()
	k := c.kernel
	c.mu.Unlock()
	if running != nil {
		running.Interrupt()
		return nil
	}
	if k != nil && k.Running() {
		return k.Interrupt(ctx)
	}
	return nil
}

// Restart gives the context a new kernel process: state is gone, the id
// stays. It is the one way a context's kernel is restarted: on request,
// and when a run does not stop after an interrupt.
func (c *Context) Restart(ctx context.Context) error {
	c.mu.Lock()
	k, deleted := c.kernel, c.deleted
	c.mu.Unlock()
	if deleted {
		return errorf(ErrNoSuchContext, "context %s was deleted", c.ID)
	}
	if k != nil {
		if err := k.Restart(ctx); !errors.Is(err, ErrKernelGone) {
			return err
		}
	}
	// No kernel yet, or it was shut down through the Jupyter API: start one.
	_, _, err := c.ensureKernel(ctx)
	return err
}

// setupCode returns code that applies cwd and env inside a running kernel
// of spec's language, or false when the language has no such code.
func setupCode(spec *kernelspecs.Spec, cwd string, env map[string]string) (string, bool) {
	if cwd == "" && len(env) == 0 {
		return "", true
	}
	cwdJS, _ := json.Marshal(cwd)
	envJS, _ := json.Marshal(env)
	if env == nil {
		envJS = []byte("{}")
	}
	switch strings.ToLower(spec.Language) {
	case "python":
		code := "import os as _kg_os\n"
		if cwd != "" {
			code += "_kg_os.chdir(" + string(cwdJS) + ")\n"
		}
		return code + "_kg_os.environ.update(" + string(envJS) + ")\ndel _kg_os\n", true
	case "typescript", "javascript":
		code := ""
		if cwd != "" {
			code += "Deno.chdir(" + string(cwdJS) + ");\n"
		}
		return code + "for (const [k, v] of Object.entries(" + string(envJS) + ")) Deno.env.set(k, v);\n", true
	case "r":
		// A JSON string is an R string literal too (R reads \", \\, \n,
		// \uXXXX and the rest of JSON's escapes).
		code := ""
		if cwd != "" {
			code += "setwd(" + string(cwdJS) + ")\n"
		}
		if len(env) > 0 {
			names := make([]string, 0, len(env))
			for k := range env {
				names = append(names, k)
			}
			sort.Strings(names)
			args := make([]string, 0, len(env))
			for _, k := range names {
				kJS, _ := json.Marshal(k)
				vJS, _ := json.Marshal(env[k])
				args = append(args, string(kJS)+" = "+string(vJS))
			}
			code += "invisible(do.call(Sys.setenv, list(" + strings.Join(args, ", ") + ")))\n"
		}
		return code, true
	}
	return "", false
}

// Created is when the context was created; a context made again under the
// same id has another.
func (c *Context) Created() time.Time { return c.created }

// KernelID is the id of the context's current kernel, or "".
func (c *Context) KernelID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kernel == nil {
		return ""
	}
	return c.kernel.id
}

// initRuns gives c its queue of runs, before c is published.
func (c *Context) initRuns() {
	m := c.m
	cfg := runs.QueueConfig{
		Limit: m.cfg.QueueLimit, Kept: m.cfg.RunsKept,
		InterruptGrace: m.cfg.InterruptGrace, StartTimeout: m.cfg.StartTimeout,
		Log: m.log, Go: m.goroutine, NoInline: c.Isolated,
	}
	if c.Isolated {
		// The kernel's place under MaxKernels is free once its process
		// is gone: the pool refills after.
		cfg.After = func() {
			m.deleteContext(context.Background(), c, false)
			if c.pool != nil {
				c.pool.refill()
			}
		}
	}
	c.runs = runs.NewQueue(c.ID, contextHost{c}, cfg)
}

// contextHost is a context as its queue's runs.Host.
type contextHost struct{ c *Context }

var _ runs.Host = contextHost{}

func (h contextHost) KernelReady() bool                 { return h.c.kernelReady() }
func (h contextHost) Restart(ctx context.Context) error { return h.c.Restart(ctx) }

func (h contextHost) Kernel(ctx context.Context) (runs.Kernel, error) {
	k, jk, err := h.c.ensureKernel(ctx)
	if err != nil {
		return nil, err
	}
	return kernelRunner{k, jk}, nil
}

// kernelRunner is a kernel's running process as runs.Kernel.
type kernelRunner struct {
	k  *Kernel
	jk process
}

var _ runs.Kernel = kernelRunner{}

func (kr kernelRunner) ID() string                          { return kr.k.id }
func (kr kernelRunner) Generation() (int, string)           { return kr.k.generation() }
func (kr kernelRunner) Forget(c runs.Call)                  { kr.jk.Forget(c) }
func (kr kernelRunner) Interrupt(ctx context.Context) error { return kr.k.Interrupt(ctx) }
func (kr kernelRunner) LateWait() time.Duration {
	kr.k.mu.Lock()
	defer kr.k.mu.Unlock()
	return kr.k.lateWait
}

func (kr kernelRunner) Execute(content jupyter.ExecuteContent, h jupyter.Handler, sending func(msgID string) error) (runs.Call, func(), error) {
	return kr.k.startRun(kr.jk, content, h, func(msgID string) error {
		if err := sending(msgID); err != nil {
			return err
		}
		// The last check before the code goes: a replica whose lease
		// lapsed (a pause, a lost store) never sends it.
		return kr.k.m.ownsKernel(kr.k.id)
	})
}

func (kr kernelRunner) Input(value string, parent *Message) error {
	m, err := kr.jk.NewMessage(jupyter.InputReply, map[string]string{"value": value}, parent)
	if err != nil {
		return err
	}
	return kr.jk.Send(jupyter.Stdin, m)
}

package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"kernelgate/kernelspecs"
	"kernelgate/workspace"
)

// A context takes its kernel from the warm pool when one is ready, and
// what the context asks for at start is applied to that kernel before its
// first run, so that code cannot tell it from a kernel started for it:
//
//   - the kernel's record becomes the context's (its env, cwd and
//     workspace, which a restart starts the next process with), and is
//     written to the store again: nothing names the pool's workspace;
//   - code run silently, outside the history, sets the env in os.environ
//     or Deno.env (so every process the kernel starts afterwards has it,
//     DENO_DIR of the context's workspace included), moves the kernel into
//     its cwd and, for Python, takes the pool's workspace's package folder
//     off sys.path and PATH (unpoolCode) and adds the context's as a start
//     would (packageCode);
//   - the packages of the create are installed after, as for any kernel.
//
// A Deno kernel keeps using the DENO_DIR it started with for its own
// module cache: the pool's workspace's .cache/deno is replaced by a link
// to the context's, and the pool's workspace is deleted with the context.
//
// What a running kernel cannot take (startOnly variables, a sandbox, which
// binds the pool's workspace only, and a language without setupCode)
// makes the context start a kernel of its own, as without a pool.

// startOnlyEnv are variables a runtime or a library reads once, when the
// process starts (locale, time zone, terminal and colour detection, thread
// pools of numeric libraries, Deno's own): set in a running kernel they
// would not act, so a context that sets one starts a fresh kernel. Those
// ValidateEnv refuses (LD_*, PYTHON*, DENO_*, …) are listed too.
var (
	startOnlyEnv = map[string]bool{
		"LANG": true, "LANGUAGE": true, "TZ": true, "TERM": true, "COLUMNS": true, "LINES": true,
		"NO_COLOR": true, "FORCE_COLOR": true, "CLICOLOR": true, "CLICOLOR_FORCE": true,
		"SSL_CERT_FILE": true, "SSL_CERT_DIR": true,
	}
	startOnlyEnvPrefixes = []string{
		"LC_", "LD_", "PYTHON", "DENO_", "NODE_", "V8_", "RUST_", "MALLOC_", "GLIBC_",
		"OMP_", "GOMP_", "KMP_", "OPENBLAS_", "MKL_", "NUMEXPR_", "VECLIB_",
	}
)

// startOnly reports whether a kernel must be started with name set for it
// to act.
func startOnly(name string) bool {
	up := strings.ToUpper(name)
	if startOnlyEnv[up] {
		return true
	}
	for _, p := range startOnlyEnvPrefixes {
		if strings.HasPrefix(up, p) {
			return true
		}
	}
	return false
}

// warmable reports whether a pooled kernel of spec can be made a context's
// with env, or why not.
func (cat *Catalog) warmable(spec *kernelspecs.Spec, env map[string]string) (bool, string) {
	if _, ok := setupCode(spec, "/", nil); !ok {
		return false, "its language has no code to move a running kernel"
	}
	if _, sb, err := cat.isolation(spec); err != nil || sb != nil {
		return false, "the sandbox binds a pooled kernel's own workspace only"
	}
	for name := range env {
		if startOnly(name) {
			return false, name + " acts only when a kernel starts"
		}
	}
	return true, ""
}

// takeWarm returns a kernel from the warm pool made the context's, or nil
// when none is ready or the context cannot take one (warmable); the caller
// then starts one.
func (c *Context) takeWarm(ctx context.Context) *Kernel {
	if ok, _ := c.m.catalog.warmable(c.spec, c.Env); !ok || c.m.ownWorkspace(c.spec) {
		return nil
	}
	p := c.m.warm.get(c.spec)
	if p == nil {
		return nil
	}
	k := p.take()
	if k == nil {
		return nil
	}
	if err := c.adoptWarm(ctx, k); err != nil {
		c.m.log.Warn("warm pool: a kernel could not be made a context's; starting one", "context", c.ID, "err", err)
		c.m.stopKernel(context.Background(), k)
		return nil
	}
	return k
}

// adoptWarm makes k, just taken from the pool, the context's. The pool's
// workspace is deleted (or kept with the context, for Deno's cache link)
// whatever the outcome.
func (c *Context) adoptWarm(ctx context.Context, k *Kernel) (err error) {
	old := k.ws
	keepOld := false
	defer func() {
		if keepOld && err == nil {
			c.spareWorkspace(old)
		} else if derr := old.Delete(); derr != nil && !errors.Is(derr, workspace.ErrClosed) {
			c.m.log.Warn("warm pool: a pooled kernel's workspace not removed", "err", derr)
		}
	}()
	jk, err := k.running(ctx)
	if err != nil {
		return err
	}
	env := maps.Clone(c.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, dirEnv(c.ws)) // as a start gives them, over the caller's
	setup, _ := setupCode(c.spec, c.Cwd, env)
	setup = unpoolCode(c.spec, old) + setup + c.m.catalog.packageCode(c.spec, c.ws)
	if from, ok := dirEnv(old)["DENO_DIR"]; ok && isDeno(c.spec) {
		keepOld = true
		if err := relink(c.ws, from); err != nil {
			return err
		}
	}
	k.life.Lock()
	k.mu.Lock()
	k.env, k.cwd, k.ws = c.Env, c.Cwd, c.ws
	k.mu.Unlock()
	k.life.Unlock()
	evalue, err := runQuiet(ctx, k, setup)
	if err == nil && evalue != "" {
		err = errors.New(evalue)
	}
	if err != nil {
		return err
	}
	c.m.records.putKernel(k, jk)
	return nil
}

// unpoolCode is the code that takes what packageCode added for the pool's
// workspace ws off a Python kernel: its folders on sys.path and PATH, and
// the import system's cache of them ("" for other languages).
func unpoolCode(spec *kernelspecs.Spec, ws *workspace.Workspace) string {
	if !strings.EqualFold(spec.Language, "python") {
		return ""
	}
	dir, _ := json.Marshal(ws.Dir())
	return `def _kg_unpool(old):
    import os, sys
    def mine(p):
        return p == old or p.startswith(old + os.sep)
    sys.path[:] = [p for p in sys.path if not mine(p)]
    for p in [p for p in sys.path_importer_cache if mine(p)]:
        del sys.path_importer_cache[p]
    os.environ["PATH"] = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if not mine(p))
_kg_unpool(` + string(dir) + `)
del _kg_unpool
`
}

// spareWorkspace keeps a pooled kernel's workspace the kernel still uses
// (Deno's cache link) until the context is deleted.
func (c *Context) spareWorkspace(ws *workspace.Workspace) {
	c.mu.Lock()
	c.spare = append(c.spare, ws)
	c.mu.Unlock()
}

// deleteSpare deletes the pooled kernels' workspaces the context kept.
func (c *Context) deleteSpare() {
	c.mu.Lock()
	spare := c.spare
	c.spare = nil
	c.mu.Unlock()
	for _, ws := range spare {
		ws.Delete()
	}
}

func isDeno(spec *kernelspecs.Spec) bool {
	switch strings.ToLower(spec.Language) {
	case "typescript", "javascript":
		return true
	}
	return false
}

// relink replaces the folder from (a pooled Deno kernel's DENO_DIR) by a
// link to ws's DENO_DIR, made when missing: the kernel, which keeps the
// path it started with, caches its modules in ws.
func relink(ws *workspace.Workspace, from string) error {
	to := dirEnv(ws)["DENO_DIR"]
	rel, err := filepath.Rel(ws.Dir(), to)
	if err != nil {
		return err
	}
	if _, err := ws.Mkdir(rel); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(from), 0o700); err != nil {
		return err
	}
	if err := os.RemoveAll(from); err != nil {
		return err
	}
	return os.Symlink(to, from)
}

// ownWorkspace says kernels of spec mount their own context's workspace
// (a kernel pod with the workspace claim): a warm one serves no other
// context. False without a provisioner (unit tests' fake starts).
func (m *Manager) ownWorkspace(spec *kernelspecs.Spec) bool {
	return m.prov != nil && m.prov.Capabilities(spec).OwnWorkspace
}

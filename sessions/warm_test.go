package sessions

import (
	"archive/zip"
	"context"
	"encoding/json"
	"kernelgate/runs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// warmManager returns a real manager whose pool of language is filled.
func warmManager(t *testing.T, cfg Config, language string) *Manager {
	t.Helper()
	m := newRealManager(t, cfg)
	if err := m.WarmPools().Prewarm([]string{language}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, m, "the pool to fill", func(ps PoolStats) bool { return ps.Ready == cfg.PoolSize })
	return m
}

// waitPool waits (up to a minute: kernels start on a busy machine) for the
// only pool to satisfy cond.
func waitPool(t *testing.T, m *Manager, what string, cond func(PoolStats) bool) PoolStats {
	t.Helper()
	var got PoolStats
	waitWithin(t, time.Minute, what, func() bool {
		ps := m.WarmPools().Stats()
		if len(ps) != 1 || !cond(ps[0]) {
			return false
		}
		got = ps[0]
		return true
	})
	return got
}

func stdout(e runs.Execution) string { return strings.Join(e.Logs.Stdout, "") }

// pureWheel writes a pure-Python wheel of module name whose VALUE is value.
func pureWheel(t *testing.T, dir, name, value string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, name+"-1.0-py3-none-any.whl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z := zip.NewWriter(f)
	info := name + "-1.0.dist-info/"
	for _, e := range [][2]string{
		{name + "/__init__.py", "VALUE = " + value + "\n"},
		{info + "METADATA", "Metadata-Version: 2.1\nName: " + name + "\nVersion: 1.0\n"},
		{info + "WHEEL", "Wheel-Version: 1.0\nGenerator: kernelgate-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
		{info + "RECORD", ""},
	} {
		w, _ := z.Create(e[0])
		w.Write([]byte(e[1]))
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
}

// A Python context created while the pool holds a ready kernel gets that
// kernel, and its code sees what a kernel started for it would: its cwd,
// its env (in a subprocess too), its workspace's package folder and
// DENO_DIR, its packages installed, the kernel id it reports; nothing of
// the pool's workspace.
func TestContextFromPoolIsTheContexts(t *testing.T) {
	wheels := t.TempDir()
	pureWheel(t, wheels, "kgwarm", "7")
	m := warmManager(t, Config{PoolSize: 1, PipFindLinks: []string{wheels}, PipNoIndex: true}, "python")

	c, err := m.CreateContext(context.Background(), ContextRequest{
		ID: "warm", Language: "python", Cwd: "sub/dir", Env: map[string]string{"GREETING": "hello"}, Packages: []string{"kgwarm"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if ps := m.WarmPools().Stats()[0]; ps.Hits != 1 {
		t.Fatalf("pool %+v: the context did not take the ready kernel", ps)
	}
	ws := c.Workspace().Dir()
	code := `import os, sys, subprocess, json, kgwarm
print(json.dumps({
  "cwd": os.getcwd(),
  "env": os.environ.get("GREETING"),
  "sub": subprocess.run(["sh", "-c", "printf %s:%s \"$GREETING\" \"$(pwd)\""], capture_output=True, text=True).stdout,
  "deno": os.environ.get("DENO_DIR"),
  "base": os.environ.get("PYTHONUSERBASE"),
  "path": os.environ["PATH"],
  "syspath": sys.path,
  "argv": sys.argv,
  "value": kgwarm.VALUE,
  "count": get_ipython().execution_count,
}))`
	_, e := run(t, m, ExecuteRequest{Context: c.ID, Code: code})
	var got struct {
		Cwd, Env, Sub, Deno, Base, Path string
		SysPath                         []string `json:"syspath"`
		Argv                            []string
		Value, Count                    int
	}
	if err := json.Unmarshal([]byte(stdout(e)), &got); err != nil {
		t.Fatalf("%v: %q %v", err, stdout(e), e.Error)
	}
	wantCwd := filepath.Join(ws, "sub", "dir")
	if got.Cwd != wantCwd || c.Cwd != wantCwd {
		t.Errorf("cwd %q (context says %q), want %q", got.Cwd, c.Cwd, wantCwd)
	}
	if got.Env != "hello" || got.Sub != "hello:"+wantCwd {
		t.Errorf("GREETING %q, in a subprocess %q", got.Env, got.Sub)
	}
	if got.Deno != filepath.Join(ws, ".cache", "deno") || got.Base != filepath.Join(ws, ".local") {
		t.Errorf("DENO_DIR %q, PYTHONUSERBASE %q: not the context's workspace %s", got.Deno, got.Base, ws)
	}
	if got.Value != 7 {
		t.Errorf("the package installed on create: VALUE %d", got.Value)
	}
	if got.Count != 1 {
		t.Errorf("execution count %d on the first run, want 1: the setup left a trace in the history", got.Count)
	}
	all := got.Path + " " + strings.Join(got.SysPath, " ")
	if strings.Contains(all, "/runs/") || !strings.Contains(all, filepath.Join(ws, ".local")) {
		t.Errorf("PATH %q and sys.path %q: want the context's .local, nothing of the pool's workspace", got.Path, got.SysPath)
	}
	kid := c.KernelID()
	if !strings.Contains(strings.Join(got.Argv, " "), kid) {
		t.Errorf("the kernel's argv %q does not name the context's kernel id %s", got.Argv, kid)
	}
	if k, err := m.Kernel(kid); err != nil || k.ws != c.ws || k.cwd != wantCwd || k.env["GREETING"] != "hello" {
		t.Errorf("the kernel %s is not recorded as the context's: %v", kid, err)
	}
	// The pool's workspace is gone: only the context's is left.
	runs, _ := os.ReadDir(filepath.Join(m.Workspaces().Dir(), "runs"))
	waitPool(t, m, "the pool to refill", func(ps PoolStats) bool { return ps.Ready == 1 })
	if after, _ := os.ReadDir(filepath.Join(m.Workspaces().Dir(), "runs")); len(runs) > 1 || len(after) != 1 {
		t.Errorf("pool workspaces left: %d before the refill, %d after (want the new pool kernel's only)", len(runs), len(after))
	}
	// A restart starts the next process as the context's.
	if _, err := restartContext(m, context.Background(), c.ID); err != nil {
		t.Fatal(err)
	}
	if _, e := run(t, m, ExecuteRequest{Context: c.ID, Code: `import os, kgwarm; print(os.getcwd(), os.environ["GREETING"], kgwarm.VALUE)`}); strings.TrimSpace(stdout(e)) != wantCwd+" hello 7" {
		t.Errorf("after a restart: %q %v", stdout(e), e.Error)
	}
}

// Contexts created at once never share a kernel: each pooled kernel is
// handed out once.
func TestPooledKernelsHandedOutOnce(t *testing.T) {
	m := warmManager(t, Config{PoolSize: 2, PoolMax: 2}, "python")
	var wg sync.WaitGroup
	cs := make([]*Context, 4)
	for i := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := m.CreateContext(context.Background(), ContextRequest{Language: "python"})
			if err != nil {
				t.Error(err)
				return
			}
			cs[i] = c
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if ps := m.WarmPools().Stats()[0]; ps.Hits < 2 {
		t.Errorf("pool %+v: the two ready kernels were not taken", ps)
	}
	seen := map[string]string{}
	for _, c := range cs {
		_, e := run(t, m, ExecuteRequest{Context: c.ID, Code: "import os; print(os.getpid())"})
		pid := strings.TrimSpace(stdout(e))
		if other, ok := seen[pid]; ok || pid == "" {
			t.Errorf("contexts %s and %s share the kernel process %q", other, c.ID, pid)
		}
		seen[pid] = c.ID
		if other, ok := seen[c.KernelID()]; ok {
			t.Errorf("contexts %s and %s share the kernel id %s", other, c.ID, c.KernelID())
		}
		seen[c.KernelID()] = c.ID
	}
}

// A variable that only acts when the process starts (TZ) makes the
// context start a kernel of its own; the pool's kernel stays ready.
func TestStartOnlyEnvStartsFreshKernel(t *testing.T) {
	m := warmManager(t, Config{PoolSize: 1}, "python")
	c, err := m.CreateContext(context.Background(), ContextRequest{Language: "python", Env: map[string]string{"TZ": "JST-9"}})
	if err != nil {
		t.Fatal(err)
	}
	if ps := m.WarmPools().Stats()[0]; ps.Hits != 0 || ps.Ready != 1 {
		t.Errorf("pool %+v: a context with TZ took the pooled kernel", ps)
	}
	if _, e := run(t, m, ExecuteRequest{Context: c.ID, Code: "import time; print(time.strftime('%Z'))"}); strings.TrimSpace(stdout(e)) != "JST" {
		t.Errorf("time zone %q, want JST", stdout(e))
	}
}

// A Deno context takes a pooled Deno kernel too, with its cwd and env
// (seen by a subprocess), and its workspace's module cache.
func TestDenoContextFromPool(t *testing.T) {
	m := warmManager(t, Config{PoolSize: 1}, "javascript")
	c, err := m.CreateContext(context.Background(), ContextRequest{Language: "javascript", Cwd: "src", Env: map[string]string{"GREETING": "hola"}})
	if err != nil {
		t.Fatal(err)
	}
	if ps := m.WarmPools().Stats()[0]; ps.Hits != 1 {
		t.Fatalf("pool %+v: the Deno context did not take the ready kernel", ps)
	}
	code := `const out = new Deno.Command("sh", {args: ["-c", "printf %s \"$GREETING\""]}).outputSync();
console.log(JSON.stringify({cwd: Deno.cwd(), env: Deno.env.get("GREETING"), sub: new TextDecoder().decode(out.stdout), deno: Deno.env.get("DENO_DIR")}));`
	_, e := run(t, m, ExecuteRequest{Context: c.ID, Code: code})
	var got struct{ Cwd, Env, Sub, Deno string }
	if err := json.Unmarshal([]byte(stdout(e)), &got); err != nil {
		t.Fatalf("%v: %q %v", err, stdout(e), e.Error)
	}
	ws := c.Workspace().Dir()
	if got.Cwd != filepath.Join(ws, "src") || got.Env != "hola" || got.Sub != "hola" || got.Deno != filepath.Join(ws, ".cache", "deno") {
		t.Errorf("Deno context from the pool sees %+v; workspace %s", got, ws)
	}
	// The module cache the kernel started with leads to the context's.
	k, _ := m.Kernel(c.KernelID())
	if len(c.spare) != 1 {
		t.Fatalf("spare workspaces %d, want the pooled kernel's", len(c.spare))
	}
	if dst, err := os.Readlink(filepath.Join(c.spare[0].Dir(), ".cache", "deno")); err != nil || dst != got.Deno || k.ws != c.ws {
		t.Errorf("the pooled DENO_DIR links to %q (%v)", dst, err)
	}
	spare := c.spare[0].Dir()
	if err := m.DeleteContext(context.Background(), c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(spare); !os.IsNotExist(err) {
		t.Errorf("the pooled kernel's workspace is left after the context's delete: %v", err)
	}
}

// The pool grows to the rate of takes, up to PoolMax, and shrinks back to
// PoolSize once idle, after which it holds no timer.
func TestPoolGrowsAndShrinks(t *testing.T) {
	m := warmManager(t, Config{PoolSize: 1, PoolMax: 3, PoolIdle: 3 * time.Second}, "python")
	// Three contexts at once: three takes within the pool's rate window.
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := m.CreateContext(context.Background(), ContextRequest{Language: "python"}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if ps := m.WarmPools().Stats()[0]; ps.Hits == 0 {
		t.Errorf("pool %+v: no context took a ready kernel", ps)
	}
	// Three takes within the window: the pool refills to three.
	waitPool(t, m, "the pool to grow to 3", func(ps PoolStats) bool { return ps.Ready+ps.Starting == 3 })
	waitPool(t, m, "the pool to shrink to 1", func(ps PoolStats) bool { return ps.Ready == 1 && ps.Starting == 0 })
	p := m.warm.get(m.Contexts()[0].spec)
	p.mu.Lock()
	armed := p.shrink != nil
	p.mu.Unlock()
	if armed {
		t.Error("a pool at its floor holds a timer")
	}
	if ps := m.WarmPools().Stats()[0]; ps.Target != 1 {
		t.Errorf("pool %+v: target above the floor when idle", ps)
	}
}

// The shared kernel of a language and the contexts of a sandbox (which
// share a workspace) take pooled kernels too, each working in its
// workspace; a sandbox's workspace outlives its contexts.
func TestSharedAndSandboxContextsFromPool(t *testing.T) {
	m := warmManager(t, Config{PoolSize: 1}, "python")
	_, e := run(t, m, ExecuteRequest{Code: "import os; print(os.getcwd())"})
	shared, err := m.Context(sharedID("python"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(stdout(e)); got != shared.Workspace().Dir() {
		t.Errorf("the shared kernel works in %q, want %q", got, shared.Workspace().Dir())
	}
	if ps := m.WarmPools().Stats()[0]; ps.Hits != 1 {
		t.Fatalf("pool %+v: the shared kernel did not take the ready kernel", ps)
	}

	waitPool(t, m, "the pool to refill", func(ps PoolStats) bool { return ps.Ready == 1 })
	ws, err := m.CreateWorkspace("sandboxes/warm", "python")
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Delete()
	c, err := m.CreateContext(context.Background(), ContextRequest{Language: "python", Workspace: ws})
	if err != nil {
		t.Fatal(err)
	}
	if ps := m.WarmPools().Stats()[0]; ps.Hits != 2 {
		t.Fatalf("pool %+v: the sandbox's context did not take the ready kernel", ps)
	}
	if _, e := run(t, m, ExecuteRequest{Context: c.ID, Code: "import os; open('made-here', 'w').close(); print(os.getcwd())"}); strings.TrimSpace(stdout(e)) != ws.Dir() {
		t.Errorf("the sandbox's context works in %q, want %q", stdout(e), ws.Dir())
	}
	if err := m.DeleteContext(context.Background(), c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ws.Dir(), "made-here")); err != nil {
		t.Errorf("the sandbox's workspace lost its file with the context: %v", err)
	}
}

//go:build linux

package local

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/leakcheck"
	"kernelgate/internal/testkernels"
	"kernelgate/kernelspecs"

	"kernelgate/jupyter"
)

// forkSpec is the python3 kernelspec forked from a zygote that preloads
// numpy, pandas and matplotlib.
func forkSpec(t *testing.T) *kernelspecs.Spec {
	t.Helper()
	dir := testkernels.WithLauncher(t, testkernels.Dir(t), LauncherFork, testkernels.Preload)
	s, err := kernelspecs.Load([]string{dir}).Get("python3")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startForked starts a forked python3 kernel and checks it was forked.
func startForked(t *testing.T, prov *Provisioner, cfg jupyter.Config) *jupyter.Kernel {
	t.Helper()
	if cfg.Spec == nil {
		cfg.Spec = forkSpec(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	k, err := jupyter.Start(ctx, prov, cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { k.Shutdown(context.Background()) })
	if _, ok := k.Process().(*forkedProcess); !ok {
		t.Fatalf("kernel was not forked: %T", k.Process())
	}
	return k
}

func TestZygoteMarkerIsLeakchecks(t *testing.T) {
	if zygoteMarker != leakcheck.ZygoteMarker {
		t.Fatalf("zygote marker %q, leakcheck skips %q", zygoteMarker, leakcheck.ZygoteMarker)
	}
}

// fdKinds prints what the kernel's descriptors are as JSON: no inode
// numbers, the kernel's own directory as ROOT, directories left out.
const fdKinds = `
import os, re, json
root = os.path.dirname(os.environ['HOME'])
kinds = []
for f in os.listdir('/proc/self/fd'):
    try:
        target = os.readlink('/proc/self/fd/' + f)
    except OSError:
        continue
    if target.startswith('/') and (os.path.isdir(target) or 'history.sqlite' in target):
        continue
    kinds.append(re.sub(r'\[\d+\]', '', target.replace(root, 'ROOT')))
print(json.dumps(sorted(kinds)))
`

// TestForkedKernelIsAnOrdinaryKernel checks what a forked kernel sees of
// its process against what it was asked for and against an exec'd kernel.
func TestForkedKernelIsAnOrdinaryKernel(t *testing.T) {
	cwd := t.TempDir()
	k := startForked(t, &Provisioner{RuntimeDir: t.TempDir()}, jupyter.Config{Cwd: cwd, Env: map[string]string{"ANSWER": "42"}})
	e := startWith(t, &Provisioner{RuntimeDir: t.TempDir(), PythonLauncher: LauncherExec}, jupyter.Config{Spec: forkSpec(t)})
	if _, ok := e.Process().(*localProcess); !ok {
		t.Fatalf("PythonLauncher exec: kernel is a %T", e.Process())
	}
	// First thing, as the kernels open more descriptors as they run: the
	// forked kernel has the same kinds of descriptors as an exec'd one
	// (their numbers vary with its threads' timing), and none of the
	// zygote's (its log, its listening socket).
	var forked, exec []string
	json.Unmarshal([]byte(stdout(t, k, fdKinds)), &forked)
	json.Unmarshal([]byte(stdout(t, e, fdKinds)), &exec)
	if len(forked) == 0 || !slices.Equal(slices.Compact(forked), slices.Compact(exec)) {
		t.Errorf("descriptors of the forked kernel:\n%v\nof an exec'd one:\n%v", forked, exec)
	}
	zygoteFDs := map[string]bool{}
	for _, pid := range zygotePIDs() {
		for _, target := range fdTargets(t, pid) {
			if target != "/dev/null" {
				zygoteFDs[target] = true
			}
		}
	}
	if len(zygoteFDs) == 0 {
		t.Fatal("no zygote descriptors found")
	}
	for _, target := range fdTargets(t, k.PID()) {
		if zygoteFDs[target] || strings.Contains(target, "zygote-") {
			t.Errorf("forked kernel holds the zygote's %s (zygote: %v)", target, zygoteFDs)
		}
	}

	got := stdout(t, k, `import os, sys; print(os.getppid() == int(os.environ['JPY_PARENT_PID']), os.getpgid(0) == os.getpid(), os.getcwd(), sys.path[0], os.environ['ANSWER'])`)
	want := strings.Join([]string{"True", "True", cwd, cwd, "42"}, " ") + "\n"
	if got != want {
		t.Errorf("parent, group, cwd, sys.path[0], env = %q, want %q", got, want)
	}
	cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(k.PID()), "cmdline"))
	if args := strings.Fields(strings.ReplaceAll(string(cmdline), "\x00", " ")); len(args) != 5 || args[1] != "-m" || args[2] != "ipykernel_launcher" || !strings.HasSuffix(args[4], ".json") {
		t.Errorf("kernel's command line %q", args)
	}
	if ppid, _ := parentOf(k.PID()); ppid != os.Getpid() {
		t.Errorf("kernel's parent is %d, want the gateway %d", ppid, os.Getpid())
	}
	env := kernelEnv(t, k)
	for _, name := range []string{"HOME", "TMPDIR", "IPYTHONDIR", "MPLCONFIGDIR"} {
		if !strings.HasPrefix(env[name], filepath.Dir(k.Process().(*forkedProcess).dir)) {
			t.Errorf("%s = %q, not in the kernel's own directory", name, env[name])
		}
	}
	// Caches that held the zygote's directories point to the kernel's.
	paths := stdout(t, k, `import tempfile, sysconfig, site, matplotlib; print(tempfile.gettempdir(), sysconfig.get_config_var('userbase'), site.getuserbase(), matplotlib.get_configdir())`)
	if want := strings.Join([]string{env["TMPDIR"], filepath.Join(env["HOME"], ".local"), filepath.Join(env["HOME"], ".local"), env["MPLCONFIGDIR"]}, " ") + "\n"; paths != want {
		t.Errorf("cached paths = %q, want %q", paths, want)
	}

	// What the zygote did once for every kernel reads as the kernel's
	// own: jupyter_client's addresses of this machine.
	const addrs = `from jupyter_client import localinterfaces as l; print(l.localhost(), l.local_ips(), l.public_ips())`
	if got, want := stdout(t, k, addrs), stdout(t, e, addrs); got != want {
		t.Errorf("local interfaces of the forked kernel %q, of an exec'd one %q", got, want)
	}

	// The same modules are loaded, the preloaded ones aside.
	if got := stdout(t, k, `import sys; print('numpy' in sys.modules, sys.argv[0].endswith('ipykernel_launcher.py'))`); got != "True True\n" {
		t.Errorf("numpy preloaded, argv[0] = %q", got)
	}
}

// fdTargets lists what the descriptors of process pid point to.
func fdTargets(t *testing.T, pid int) []string {
	t.Helper()
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil {
			out = append(out, target)
		}
	}
	return out
}

func TestForkedKernelsHaveTheirOwnRandomState(t *testing.T) {
	prov := &Provisioner{RuntimeDir: t.TempDir()}
	const code = `import random, numpy, os; print(random.random(), numpy.random.rand(), os.urandom(8).hex())`
	a := stdout(t, startForked(t, prov, jupyter.Config{}), code)
	b := stdout(t, startForked(t, prov, jupyter.Config{}), code)
	fa, fb := strings.Fields(a), strings.Fields(b)
	if len(fa) != 3 || len(fb) != 3 {
		t.Fatalf("outputs %q %q", a, b)
	}
	for i, what := range []string{"random.random()", "numpy.random.rand()", "os.urandom(8)"} {
		if fa[i] == fb[i] {
			t.Errorf("two forked kernels got the same %s: %s", what, fa[i])
		}
	}
}

// TestForkedKernelInterruptRestartKill: SIGINT to the process group
// interrupts, restart forks a fresh kernel, SIGKILL is a death with its
// status.
func TestForkedKernelInterruptRestartKill(t *testing.T) {
	k := startForked(t, &Provisioner{RuntimeDir: t.TempDir()}, jupyter.Config{})
	execute(t, k, "kept = 'yes'")
	col := newCollector()
	// As in TestInterrupt: with stop_on_error, ipykernel would abort the
	// check that reaches it while it finishes the interrupted reply.
	block := jupyter.NewExecute(pySleeping)
	block.StopOnError = false
	call, err := k.StartExecute(block, col.handle)
	if err != nil {
		t.Fatal(err)
	}
	col.await(t, jupyter.StreamMsg, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := k.Interrupt(ctx); err != nil {
		t.Fatal(err)
	}
	reply, err := call.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r := replyOf(t, reply); r.EName != "KeyboardInterrupt" {
		t.Errorf("interrupted reply %+v, want KeyboardInterrupt", r)
	}
	if got := stdout(t, k, "print(kept)"); got != "yes\n" {
		t.Errorf("state after interrupt: %q", got)
	}

	k2, err := k.Restart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k2.Shutdown(context.Background()) })
	if _, ok := k2.Process().(*forkedProcess); !ok {
		t.Errorf("restarted kernel is a %T", k2.Process())
	}
	if r := replyOf(t, first(execute(t, k2, "kept"))); r.EName != "NameError" {
		t.Errorf("kept after restart: %+v, want NameError", r)
	}

	col = newCollector()
	call, err = k2.StartExecute(jupyter.NewExecute("import time; time.sleep(30)"), col.handle)
	if err != nil {
		t.Fatal(err)
	}
	col.await(t, jupyter.ExecuteInput, 10*time.Second)
	syscall.Kill(k2.PID(), syscall.SIGKILL)
	_, err = call.Wait(ctx)
	var died *jupyter.DiedError
	if !errors.As(err, &died) || !strings.Contains(died.Status, "killed") {
		t.Fatalf("after SIGKILL: %v, want a DiedError saying killed", err)
	}
}

func first(m *jupyter.Message, _ *collector) *jupyter.Message { return m }

// TestZygoteDeathLeavesKernelsRunning kills the zygote under a running
// kernel: the kernel goes on, and the next start forks from a new zygote.
func TestZygoteDeathLeavesKernelsRunning(t *testing.T) {
	prov := &Provisioner{RuntimeDir: t.TempDir()}
	k := startForked(t, prov, jupyter.Config{})
	pids := zygotePIDs()
	if len(pids) == 0 {
		t.Fatal("no zygote")
	}
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if got := stdout(t, k, "print(6*7)"); got != "42\n" {
		t.Errorf("kernel after its zygote died: %q", got)
	}
	k2 := startForked(t, prov, jupyter.Config{})
	if got := stdout(t, k2, "print(6*7)"); got != "42\n" {
		t.Errorf("kernel of the new zygote: %q", got)
	}
	if slices.Contains(pids, k2.PID()) || slices.Equal(zygotePIDs(), pids) {
		t.Errorf("zygotes %v after %v died", zygotePIDs(), pids)
	}
	if got := stdout(t, k, "print(6*7)"); got != "42\n" {
		t.Errorf("first kernel later: %q", got)
	}
}

func TestZygoteServesOnlyTheGateway(t *testing.T) {
	startForked(t, &Provisioner{RuntimeDir: t.TempDir()}, jupyter.Config{})
	var sock string
	for _, z := range runningZygotes() {
		if z.alive() {
			sock = z.sock
		}
	}
	if sock == "" {
		t.Fatal("no running zygote")
	}
	// A process other than the gateway asks for a kernel: it gets an
	// error or a closed connection, never a pid, and nothing is forked.
	before := len(leakcheck.Children())
	out, err := exec.Command("/usr/bin/python3", "-c", `
import socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
b = b'{"argv": ["x", "-m", "ipykernel_launcher"], "env": {}, "cwd": "/"}'
try:
    s.sendall(struct.pack(">I", len(b)) + b)
except OSError:
    pass
print(s.recv(65536).decode(errors="replace"))
`, sock).CombinedOutput()
	if err != nil || strings.Contains(string(out), `"pid"`) {
		t.Errorf("request from another process: %v %s", err, out)
	}
	if !strings.Contains(string(out), "PermissionError") && strings.TrimSpace(string(out)) != "" {
		t.Errorf("request from another process answered %s", out)
	}
	if after := len(leakcheck.Children()); after > before {
		t.Errorf("children %d → %d", before, after)
	}
}

// TestForkedKernelStdinAndDisplays: input() round-trips on stdin, and a
// preloaded matplotlib and pandas render as in an exec'd kernel.
func TestForkedKernelStdinAndDisplays(t *testing.T) {
	k := startForked(t, &Provisioner{RuntimeDir: t.TempDir()}, jupyter.Config{})
	t.Run("input", func(t *testing.T) {
		col := newCollector()
		content := jupyter.NewExecute("name = input('name? ')\nprint('hello', name)")
		content.AllowStdin = true
		call, err := k.StartExecute(content, col.handle)
		if err != nil {
			t.Fatal(err)
		}
		req := col.await(t, jupyter.InputRequest, 10*time.Second)
		m, err := k.NewMessage(jupyter.InputReply, map[string]string{"value": "ada"}, req)
		if err != nil {
			t.Fatal(err)
		}
		if err := k.Send(jupyter.Stdin, m); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := call.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if s := contentOf(t, col.await(t, jupyter.StreamMsg, time.Second)); s.Text != "hello ada\n" {
			t.Errorf("stdout %q", s.Text)
		}
	})
	t.Run("matplotlib png", func(t *testing.T) {
		_, c := execute(t, k, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
		d := contentOf(t, c.await(t, jupyter.DisplayData, time.Second))
		if len(d.Data["image/png"]) < 100 {
			t.Errorf("display_data has no image/png: keys %v", keys(d.Data))
		}
	})
	t.Run("pandas html", func(t *testing.T) {
		_, c := execute(t, k, "import pandas as pd\npd.DataFrame({'a': [1, 2]})")
		if d := contentOf(t, c.await(t, jupyter.ExecuteResult, time.Second)); d.Data["text/html"] == nil {
			t.Errorf("DataFrame bundle keys = %v", keys(d.Data))
		}
	})
	t.Run("threaded BLAS", func(t *testing.T) {
		got := stdout(t, k, "import numpy as np, os\na = np.ones((400, 400))\nprint((a @ a)[0, 0], len(os.listdir('/proc/self/task')) > 0)")
		if got != "400.0 True\n" {
			t.Errorf("matrix product: %q", got)
		}
	})
}

// checkForked fails the test unless the kernels were forked when forked
// is set.
func checkForked(t *testing.T, forked bool, ks ...*jupyter.Kernel) {
	t.Helper()
	for _, k := range ks {
		if _, ok := k.Process().(*forkedProcess); forked && !ok {
			t.Fatalf("kernel was not forked: %T", k.Process())
		}
	}
}

func TestLaunchMetadata(t *testing.T) {
	cases := []struct {
		md       map[string]any
		launcher string
		preload  []string
		bad      bool
	}{
		{nil, "", nil, false},
		{map[string]any{"launcher": "exec"}, "exec", nil, false},
		{map[string]any{"launcher": "fork", "preload": []any{"numpy", "matplotlib.pyplot", "_x1"}}, "fork", []string{"numpy", "matplotlib.pyplot", "_x1"}, false},
		{map[string]any{"launcher": "spawn"}, "", nil, true},
		{map[string]any{"launcher": true}, "", nil, true},
		{map[string]any{"preload": []any{"os; import sys"}}, "", nil, true},
		{map[string]any{"preload": []any{"1abc"}}, "", nil, true},
		{map[string]any{"preload": []any{"a..b"}}, "", nil, true},
		{map[string]any{"preload": []any{3.0}}, "", nil, true},
	}
	for _, c := range cases {
		spec := &kernelspecs.Spec{Name: "x", Metadata: map[string]any{"kernelgate": c.md}}
		launcher, preload, err := launchMetadata(spec)
		if (err != nil) != c.bad || launcher != c.launcher || !slices.Equal(preload, c.preload) {
			t.Errorf("%v: %q %v %v", c.md, launcher, preload, err)
		}
	}
}

// TestZygoteThatCannotStartFallsBackToExec: a preload that fails to import
// keeps the zygote from starting; kernels are exec'd meanwhile.
func TestZygoteThatCannotStartFallsBackToExec(t *testing.T) {
	dir := testkernels.WithLauncher(t, testkernels.Dir(t), LauncherFork, []string{"no_such_module_for_a_zygote"})
	spec, err := kernelspecs.Load([]string{dir}).Get("python3")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		k := startWith(t, &Provisioner{RuntimeDir: t.TempDir()}, jupyter.Config{Spec: spec})
		if _, ok := k.Process().(*localProcess); !ok {
			t.Fatalf("start %d: kernel is a %T, want exec'd", i, k.Process())
		}
	}
	bad := map[string]any{"kernelgate": map[string]any{"launcher": "spawn"}}
	badSpec := *spec
	badSpec.Metadata = bad
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := jupyter.Start(ctx, &Provisioner{RuntimeDir: t.TempDir()}, jupyter.Config{Spec: &badSpec}); !errors.Is(err, jupyter.ErrStartFailed) || !strings.Contains(err.Error(), "launcher") {
		t.Errorf("bad launcher metadata: %v", err)
	}
}

// spareOf waits until the zygote of the running forked kernels has a
// spare child and returns its pid.
func spareOf(t *testing.T) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, z := range runningZygotes() {
			z.mu.Lock()
			sp := z.spare
			z.mu.Unlock()
			if sp != nil {
				return sp.pid
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no spare child within 20s")
	return 0
}

// TestSpareChildBecomesTheNextKernel: the next launch claims the spare
// child, which gets the launch's limits in its cgroup.
func TestSpareChildBecomesTheNextKernel(t *testing.T) {
	needCgroups(t, "memory", "pids")
	prov := &Provisioner{RuntimeDir: t.TempDir()}
	startForked(t, prov, jupyter.Config{})
	spare := spareOf(t)
	k := startForked(t, prov, jupyter.Config{Options: &Options{Limits: &Limits{MemoryBytes: 300 << 20, Pids: 77}}})
	if k.PID() != spare {
		t.Fatalf("kernel %d, spare was %d", k.PID(), spare)
	}
	fp := k.Process().(*forkedProcess)
	for _, leaf := range fp.cg.snapshot() {
		if leaf.has("memory") {
			file := "memory.limit_in_bytes"
			if leaf.v2 {
				file = "memory.max"
			}
			if b, _ := os.ReadFile(filepath.Join(leaf.dir, file)); strings.TrimSpace(string(b)) != strconv.Itoa(300<<20) {
				t.Errorf("%s = %s", file, b)
			}
		}
		if leaf.has("pids") {
			if b, _ := os.ReadFile(filepath.Join(leaf.dir, "pids.max")); strings.TrimSpace(string(b)) != "77" {
				t.Errorf("pids.max = %s", b)
			}
		}
		procs, _ := os.ReadFile(filepath.Join(leaf.dir, "cgroup.procs"))
		if !slices.Contains(strings.Fields(string(procs)), strconv.Itoa(k.PID())) {
			t.Errorf("kernel %d not in %s: %s", k.PID(), leaf.dir, procs)
		}
	}
	if got := stdout(t, k, "print(6*7)"); got != "42\n" {
		t.Errorf("claimed kernel: %q", got)
	}
}

// TestSpareHoldsTheCopiesAKernelMakes: a kernel writes to thousands of
// the pages it shares with its zygote; a parked spare has already copied
// nearly all of those it will write (learnt from the zygote's rehearsal),
// and the rehearsal left no process and no file behind.
func TestSpareHoldsTheCopiesAKernelMakes(t *testing.T) {
	prov := &Provisioner{RuntimeDir: t.TempDir()}
	k := startForked(t, prov, jupyter.Config{})
	stdout(t, k, "1+1")
	spare := spareOf(t)
	var z *zygote
	for _, x := range runningZygotes() {
		x.mu.Lock()
		if x.spare != nil && x.spare.pid == spare {
			z = x
		}
		x.mu.Unlock()
	}
	if z == nil {
		t.Fatal("no zygote holds the spare")
	}
	kernel := copiedPages(t, z.pid, k.PID())
	if len(kernel) < 1000 {
		t.Fatalf("the kernel copied %d pages of its zygote", len(kernel))
	}
	// The spare copies while parked and says nothing when done: its
	// pages are read until they hold the kernel's.
	var common, spareCopies int
	if !poll(20*time.Second, func() bool {
		copies := copiedPages(t, z.pid, spare)
		common, spareCopies = 0, len(copies)
		for pg := range kernel {
			if copies[pg] {
				common++
			}
		}
		return common >= len(kernel)*9/10
	}) {
		t.Errorf("the parked spare copied %d pages, %d of the %d the kernel copied", spareCopies, common, len(kernel))
	}
	t.Logf("the kernel copied %d pages of its zygote, the parked spare %d (%d of them the same)", len(kernel), spareCopies, common)
	if spareCopies > len(kernel)*3/2 {
		t.Errorf("the parked spare copied %d pages, the kernel only %d", spareCopies, len(kernel))
	}

	// The rehearsal's process is gone (the zygote's kernels and spares
	// are the gateway's children), and so is its directory.
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, err := parentOf(pid); err == nil && ppid == z.pid {
			t.Errorf("the zygote has a child %d", pid)
		}
	}
	left, _ := filepath.Glob(filepath.Join(z.dir, "z", "tmp", "rehearsal-*"))
	if len(left) > 0 {
		t.Errorf("rehearsal left %v", left)
	}
}

// copiedPages returns the pages of zygote's private writable mappings
// that are present in it and present and exclusively owned in pid (which
// was forked from it): the pages pid has copied.
func copiedPages(t *testing.T, zygote, pid int) map[uintptr]bool {
	t.Helper()
	const present, exclusive = 1 << 63, 1 << 56
	page := uintptr(os.Getpagesize())
	maps, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(zygote), "maps"))
	if err != nil {
		t.Fatal(err)
	}
	zf, err := os.Open(filepath.Join("/proc", strconv.Itoa(zygote), "pagemap"))
	if err != nil {
		t.Fatal(err)
	}
	defer zf.Close()
	pf, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "pagemap"))
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	out := map[uintptr]bool{}
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[1] != "rw-p" {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		a, _ := strconv.ParseUint(lo, 16, 64)
		b, _ := strconv.ParseUint(hi, 16, 64)
		n := int((b - a) / uint64(page))
		zb, pb := make([]byte, 8*n), make([]byte, 8*n)
		off := int64(a / uint64(page) * 8)
		if _, err := zf.ReadAt(zb, off); err != nil {
			continue
		}
		if _, err := pf.ReadAt(pb, off); err != nil {
			continue
		}
		for i := 0; i < n; i++ {
			ze := binary.LittleEndian.Uint64(zb[8*i:])
			pe := binary.LittleEndian.Uint64(pb[8*i:])
			if ze&present != 0 && pe&(present|exclusive) == present|exclusive {
				out[uintptr(a)+uintptr(i)*page] = true
			}
		}
	}
	return out
}

// TestZygotesOutliveGatewayThreads: a parent-death signal follows the
// thread that forked, and Go ends a thread whose goroutine exits while
// locked to it. A process started as zygotes are, from a goroutine whose
// thread then ends, must live on (with cmd.Start in that goroutine it is
// killed).
func TestZygotesOutliveGatewayThreads(t *testing.T) {
	ended := false
	for attempt := 0; attempt < 10 && !ended; attempt++ {
		cmd := exec.Command("/bin/sleep", "30")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		tids := make(chan int, 1)
		started := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // and exit locked: the thread ends
			tids <- syscall.Gettid()
			started <- startOnParentThread(cmd)
		}()
		tid := <-tids
		if err := <-started; err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() {
			cmd.Wait()
			close(exited)
		}()
		// The main thread is wedged rather than ended: try again then.
		task := filepath.Join("/proc/self/task", strconv.Itoa(tid))
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(task); err != nil {
				ended = true
				break
			}
		}
		select {
		case <-exited:
			t.Fatalf("the process died with the thread %d that asked for it (thread ended: %v)", tid, ended)
		case <-time.After(300 * time.Millisecond):
		}
		cmd.Process.Kill()
		<-exited
	}
	if !ended {
		t.Fatal("no locked thread ended in 10 tries")
	}
	// The kernels of a zygote live on too.
	k := startForked(t, &Provisioner{RuntimeDir: t.TempDir()}, jupyter.Config{})
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
		}()
	}
	wg.Wait()
	if got := stdout(t, k, "print(6*7)"); got != "42\n" {
		t.Errorf("kernel after gateway threads ended: %q (%v)", got, k.Err())
	}
}

// runningZygotes lists the zygotes that started.
func runningZygotes() []*zygote {
	zygotes.mu.Lock()
	defer zygotes.mu.Unlock()
	var zs []*zygote
	for _, s := range zygotes.slots {
		select {
		case <-s.ready:
			if s.z != nil {
				zs = append(zs, s.z)
			}
		default:
		}
	}
	return zs
}

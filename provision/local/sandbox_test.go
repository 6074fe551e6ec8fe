//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"kernelgate/internal/needs"
	"kernelgate/internal/testkernels"

	"kernelgate/jupyter"
)

// needSandbox skips the test when bubblewrap is missing or cannot make
// namespaces here.
func needSandbox(t *testing.T) {
	t.Helper()
	bwrap, err := (&SandboxConfig{}).bwrapPath()
	if err != nil {
		needs.Skip(t, "no sandbox: %v", err)
	}
	if out, err := exec.Command(bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--", "/bin/true").CombinedOutput(); err != nil {
		needs.Skip(t, "bwrap cannot sandbox here: %v: %s", err, out)
	}
}

// sandboxRuntime is a runtime directory for sandboxed kernels: a
// t.TempDir whose parent (the test's own, 0700) is made searchable, so that
// the sandbox user reaches the kernels' directories in it.
func sandboxRuntime(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := searchable(filepath.Dir(dir)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// loopbackListener is a TCP port on the host's loopback that a sandboxed
// kernel must not reach. It fails the test if anything connects.
func loopbackListener(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		select {
		case <-accepted:
			t.Errorf("a sandboxed kernel connected to the host's loopback port")
		default:
		}
	})
	return ln.Addr().(*net.TCPAddr).Port
}

// keepGoing is an execute_request of code that fails without making the
// kernel abort the requests queued behind it (stop_on_error does, for a
// moment, also to requests sent right after the error reply).
func keepGoing(code string) jupyter.ExecuteContent {
	c := jupyter.NewExecute(code)
	c.StopOnError = false
	return c
}

// interruptKeepsState sets kept, runs block until it has printed, then
// interrupts it and checks that the reply is an error and kept survived.
func interruptKeepsState(t *testing.T, k *jupyter.Kernel, setup, block, check, want string) {
	t.Helper()
	execute(t, k, setup)
	col := newCollector()
	call, err := k.StartExecute(keepGoing(block), col.handle)
	if err != nil {
		t.Fatal(err)
	}
	col.await(t, jupyter.StreamMsg, 10*time.Second) // the code runs: no race with its start
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := k.Interrupt(ctx); err != nil {
		t.Fatalf("interrupt: %v", err)
	}
	reply, err := call.Wait(ctx)
	if err != nil {
		t.Fatalf("interrupted call: %v", err)
	}
	if took := time.Since(t0); took > 5*time.Second {
		t.Errorf("interrupt took %v", took)
	}
	if r := replyOf(t, reply); r.Status != "error" {
		t.Errorf("interrupted reply status = %q, want error", r.Status)
	}
	_, after := execute(t, k, check)
	if got := plainText(t, contentOf(t, after.await(t, jupyter.ExecuteResult, 2*time.Second))); got != want {
		t.Errorf("state after interrupt: got %q, want %q", got, want)
	}
	if err := k.Err(); err != nil {
		t.Errorf("kernel died: %v", err)
	}
}

func TestSandboxedPython(t *testing.T) {
	needSandbox(t)
	port := loopbackListener(t)
	var hide []string
	for _, p := range []string{"/etc/ssl", "/etc/hostname"} {
		if exists(p) {
			hide = append(hide, p)
		}
	}
	prov := &Provisioner{RuntimeDir: sandboxRuntime(t), Transport: "ipc", Sandbox: &SandboxConfig{Hide: hide}}
	spec := testkernels.Spec(t, "python3")
	k := startWith(t, prov, jupyter.Config{Spec: spec})
	other := startWith(t, prov, jupyter.Config{Spec: spec})

	t.Run("result", func(t *testing.T) {
		_, c := execute(t, k, "1+1")
		if got := plainText(t, contentOf(t, c.await(t, jupyter.ExecuteResult, time.Second))); got != "2" {
			t.Errorf("1+1 = %q", got)
		}
	})
	t.Run("file system", func(t *testing.T) {
		got := stdout(t, k, `
import errno, os
def write(p):
    try:
        with open(p, "w") as f:
            f.write("x")
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
print(write("/usr/x"), write(os.path.join(os.getcwd(), "f")), write("/tmp/f"), write(os.path.join(os.environ["HOME"], "f")))`)
		if strings.TrimSpace(got) != "EROFS ok ok ok" {
			t.Errorf("writes to /usr, cwd, /tmp, HOME = %q, want EROFS ok ok ok", got)
		}
	})
	t.Run("hidden", func(t *testing.T) {
		// The runtime dir shows this kernel's directory only, without the
		// other kernel's and without the gateway's part of its own.
		got := stdout(t, k, fmt.Sprintf(`
import os
print(len(os.listdir(%q)), os.listdir(os.path.dirname(os.path.dirname(os.environ["HOME"])) ))
print(os.listdir("/tmp"))`, prov.RuntimeDir))
		lines := strings.Split(strings.TrimSpace(got), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "1 ['kernel']") {
			t.Errorf("runtime dir seen from the sandbox: %q", got)
		}
		for _, p := range hide {
			got := stdout(t, k, fmt.Sprintf(`
import os
p = %q
print(os.listdir(p) if os.path.isdir(p) else repr(open(p).read()))`, p))
			if s := strings.TrimSpace(got); s != "[]" && s != "''" {
				t.Errorf("hidden %s shows %s", p, s)
			}
		}
	})
	t.Run("no gateway processes", func(t *testing.T) {
		got := stdout(t, k, "import os; print(' '.join(p for p in os.listdir('/proc') if p.isdigit()))")
		pids := strings.Fields(got)
		for _, p := range pids {
			if p == strconv.Itoa(os.Getpid()) || p == strconv.Itoa(other.PID()) {
				t.Errorf("pid %s of the host is visible in the sandbox (%v)", p, pids)
			}
		}
		if len(pids) > 10 {
			t.Errorf("sandbox sees %d processes: %v", len(pids), pids)
		}
	})
	t.Run("no capabilities", func(t *testing.T) {
		got := stdout(t, k, "print([l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapEff', 'NoNewPrivs'))])")
		if strings.TrimSpace(got) != "['0000000000000000', '1']" {
			t.Errorf("CapEff, NoNewPrivs = %s", got)
		}
	})
	t.Run("no network", func(t *testing.T) {
		got := stdout(t, k, fmt.Sprintf(`
import socket
try:
    socket.create_connection(("127.0.0.1", %d), timeout=2)
    print("connected")
except OSError as e:
    print(type(e).__name__)`, port))
		if strings.TrimSpace(got) != "ConnectionRefusedError" {
			t.Errorf("connecting to the host's loopback: %q, want ConnectionRefusedError", got)
		}
	})
	t.Run("interrupt keeps state", func(t *testing.T) {
		interruptKeepsState(t, k, "kept = 'yes'", pySleeping, "kept", "'yes'")
	})
}

func TestSandboxedDeno(t *testing.T) {
	needSandbox(t)
	port := loopbackListener(t)
	// Deno speaks tcp only: without network it is reached through the bridge.
	prov := &Provisioner{RuntimeDir: sandboxRuntime(t), Sandbox: &SandboxConfig{}}
	k := startWith(t, prov, jupyter.Config{Spec: testkernels.Spec(t, "deno")})
	cases := []struct{ name, code, want string }{
		{"result", "1+1", "2"},
		{"DENO_DIR writable", `const d = Deno.env.get("DENO_DIR"); await Deno.mkdir(d, {recursive: true}); await Deno.writeTextFile(d + "/probe", "xy"); (await Deno.readTextFile(d + "/probe")).length`, "2"},
		{"no network", fmt.Sprintf(`let r = "connected"; try { (await Deno.connect({hostname: "127.0.0.1", port: %d})).close() } catch (e) { r = e.name }; r`, port), `"ConnectionRefused"`},
		{"read-only host", `let w = "written"; try { Deno.writeTextFileSync("/usr/x", "x") } catch (e) { w = e.message.includes("Read-only file system") }; w`, "true"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, col := execute(t, k, c.code)
			if got := plainText(t, contentOf(t, col.await(t, jupyter.ExecuteResult, 2*time.Second))); got != c.want {
				t.Errorf("%s = %s, want %s", c.code, got, c.want)
			}
		})
	}
	t.Run("heartbeat", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := k.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("interrupt keeps state", func(t *testing.T) {
		interruptKeepsState(t, k, "const kept = 'yes'", "console.log('spinning'); while (true) {}", "kept", `"yes"`)
	})
	t.Run("with network", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			if c, err := ln.Accept(); err == nil {
				c.Close()
			}
		}()
		prov := &Provisioner{RuntimeDir: sandboxRuntime(t), Sandbox: &SandboxConfig{Network: true}}
		k := startWith(t, prov, jupyter.Config{Spec: testkernels.Spec(t, "deno")})
		code := fmt.Sprintf(`let r = "connected"; try { (await Deno.connect({hostname: "127.0.0.1", port: %d})).close() } catch (e) { r = e.name }; r`, ln.Addr().(*net.TCPAddr).Port)
		_, col := execute(t, k, code)
		if got := plainText(t, contentOf(t, col.await(t, jupyter.ExecuteResult, 2*time.Second))); got != `"connected"` {
			t.Errorf("with network, connecting to the host's loopback: %s", got)
		}
	})
}

func TestBwrapArgs(t *testing.T) {
	for _, p := range []string{"/var/tmp", "/etc/hostname", "/etc/ssl", "/srv"} {
		if !exists(p) {
			needs.Skip(t, "%s does not exist here", p)
		}
	}
	dir := filepath.Join(t.TempDir(), "kernel-1")
	kd := KernelDirs{Root: filepath.Join(dir, "kernel")}
	if err := os.MkdirAll(filepath.Join(kd.Root, "work"), 0o700); err != nil {
		t.Fatal(err)
	}
	common := []string{"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL"}
	// What every sandbox hides, as it exists here.
	var always []string
	for _, p := range alwaysHidden {
		switch fi, err := os.Stat(p); {
		case err != nil:
		case fi.IsDir():
			always = append(always, "--tmpfs", p)
		default:
			always = append(always, "--ro-bind", dir+"/sealed", p)
		}
	}
	start := []string{"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp"}
	cases := []struct {
		name    string
		cfg     SandboxConfig
		runtime string
		cwd     string
		infoFD  int
		want    []string
	}{
		{"runtime under /tmp", SandboxConfig{}, "/tmp/kg", kd.Root + "/work", 0,
			cat(start, always, []string{"--bind", kd.Root, kd.Root, "--chdir", kd.Root + "/work"}, common, []string{"--unshare-net", "--"})},
		{"network, hidden paths, outside cwd, info fd", SandboxConfig{Network: true, Hide: []string{"/etc/hostname", "/nonexistent/x", "relative"}}, "/etc/ssl", "/srv", 4,
			cat(start, always, []string{"--ro-bind", dir + "/empty", "/etc/hostname", "--tmpfs", "/etc/ssl",
				"--bind", kd.Root, kd.Root, "--bind", "/srv", "/srv", "--chdir", "/srv"}, common, []string{"--info-fd", "4", "--"})},
	}
	// The gateway's own user: the paths as the test sees them.
	u := sandboxUser{uid: os.Geteuid(), gid: os.Getegid()}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.cfg.bwrapArgs(u, c.runtime, kd, c.cwd, c.cwd, "", c.infoFD)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("bwrapArgs =\n%q\nwant\n%q", got, c.want)
			}
		})
	}
}

func cat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// Sandboxed kernels with limits leave no cgroup, process, goroutine, file
// descriptor or directory behind.
func TestSandboxCyclesLeakNothing(t *testing.T) {
	needSandbox(t)
	needCgroups(t, "memory", "pids")
	prov := &Provisioner{
		RuntimeDir: sandboxRuntime(t),
		Sandbox:    &SandboxConfig{},
		Limits:     Limits{MemoryBytes: 1 << 30, Pids: 256, NoFile: 1024},
	}
	ipc := &Provisioner{RuntimeDir: prov.RuntimeDir, Transport: "ipc", Sandbox: prov.Sandbox, Limits: prov.Limits}
	run := func(p *Provisioner, name string) []string {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		k, err := jupyter.Start(ctx, p, jupyter.Config{Spec: testkernels.Spec(t, name)})
		if err != nil {
			t.Fatal(err)
		}
		var dirs []string
		for _, leaf := range k.Process().(*localProcess).cg.leaves {
			dirs = append(dirs, leaf.dir)
		}
		if len(dirs) == 0 {
			t.Errorf("%s: no cgroup", name)
		}
		if _, err := k.Execute(ctx, "1+1", nil); err != nil {
			t.Fatal(err)
		}
		k.Shutdown(ctx)
		return dirs
	}
	run(prov, "python3") // warm up lazily started runtime goroutines and caches
	before := snapshot(t)
	var dirs []string
	for _, c := range []struct {
		p    *Provisioner
		name string
	}{{prov, "python3"}, {prov, "deno"}, {ipc, "python3"}, {prov, "deno"}, {ipc, "python3"}} {
		dirs = append(dirs, run(c.p, c.name)...)
	}
	checkNoLeaks(t, before)
	for _, d := range dirs {
		if exists(d) {
			t.Errorf("cgroup %s is still there", d)
		}
	}
	if entries, _ := os.ReadDir(prov.RuntimeDir); len(entries) != 0 {
		t.Errorf("runtime dir still holds %d entries", len(entries))
	}
}

// A sandbox or limit that fails at any step of a launch leaves nothing
// behind.
func TestSandboxStartFailuresLeaveNothing(t *testing.T) {
	needSandbox(t)
	needCgroups(t, "memory", "pids")
	host, _ := hostCgroups()
	cases := []struct {
		name, transport, bwrap string
		unreachable            bool // the runtime dir, by the sandbox user
	}{
		{"bwrap missing", "", "/nonexistent/bwrap", false},
		{"bwrap fails, bridged", "", "/bin/false", false},
		{"bwrap fails, ipc", "ipc", "/bin/false", false},
		{"runtime dir unreachable", "", "", true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var runtime string
			switch {
			case !c.unreachable:
				runtime = sandboxRuntime(t)
			case os.Geteuid() != 0:
				needs.Skip(t, "the sandbox user is the gateway's: the test runs as uid %d, not root", os.Geteuid())
			default:
				runtime = t.TempDir() // below the test's own 0700 directory
			}
			prov := &Provisioner{
				RuntimeDir: runtime, Transport: c.transport,
				Sandbox: &SandboxConfig{Bwrap: c.bwrap}, Limits: Limits{MemoryBytes: 1 << 30, Pids: 100},
			}
			id := fmt.Sprintf("failing-%d", i)
			before := len(children())
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := jupyter.Start(ctx, prov, jupyter.Config{ID: id, Spec: testkernels.Spec(t, "python3")})
			if !errors.Is(err, jupyter.ErrStartFailed) {
				t.Fatalf("err = %v, want ErrStartFailed", err)
			}
			t.Logf("start: %v", err)
			if n := len(children()); n > before {
				t.Errorf("%d child processes left", n-before)
			}
			if entries, _ := os.ReadDir(prov.RuntimeDir); len(entries) != 0 {
				t.Errorf("runtime dir still holds %d entries", len(entries))
			}
			for _, h := range host.hierarchies {
				entries, _ := os.ReadDir(h.parent)
				for _, e := range entries {
					if strings.HasPrefix(e.Name(), "k-"+id+"-") {
						t.Errorf("cgroup %s left in %s", e.Name(), h.parent)
					}
				}
			}
		})
	}
}

func TestSandboxedProgramBelowTmp(t *testing.T) {
	// A kernel installed in a checkout below /tmp still starts in the
	// sandbox, whose /tmp is empty: its program's directory is bound back.
	if _, err := exec.LookPath("bwrap"); err != nil {
		needs.Skip(t, "bwrap is not installed")
	}
	dir, err := os.MkdirTemp("/tmp", "kg-program-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	prog := filepath.Join(dir, "python3")
	if err := os.Symlink("/usr/bin/python3", prog); err != nil {
		t.Fatal(err)
	}
	// The link resolves out of /tmp: bind nothing. A real file below /tmp: bind its directory.
	var cfg SandboxConfig
	runtime := t.TempDir()
	kd := KernelDirs{Root: filepath.Join(runtime, "kernel"), Work: filepath.Join(runtime, "kernel", "work")}
	os.MkdirAll(kd.Work, 0o755)
	args, err := cfg.bwrapArgs(sandboxUser{}, runtime, kd, kd.Work, kd.Work, prog, 0)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.Join(args, " "), dir) {
		t.Errorf("a link out of /tmp binds %s: %v", dir, args)
	}
	real := filepath.Join(dir, "tool")
	os.WriteFile(real, []byte("#!/bin/sh\n"), 0o755)
	if args, _ := cfg.bwrapArgs(sandboxUser{}, runtime, kd, kd.Work, kd.Work, real, 0); !strings.Contains(strings.Join(args, " "), "--ro-bind "+dir+" "+dir) {
		t.Errorf("program below /tmp not bound: %v", args)
	}
}

// procStat reads a process whose command holds spaces and parentheses
// (the fields after it still line up), and refuses it once it has ended:
// a zombie, then a reaped pid. parentOf reads its parent, zombie or not.
func TestProcStatOddCommandAndZombie(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	odd := filepath.Join(t.TempDir(), "a) Z 1 (b")
	if err := os.WriteFile(odd, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(odd, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	ownGroup, ownStart, err := procStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	pgrp, start, err := procStat(pid)
	if err != nil {
		t.Fatalf("procStat(%d): %v", pid, err)
	}
	if pgrp != ownGroup || start < ownStart {
		t.Errorf("procStat(%d) = group %d, start %d; want this process's group %d, a start from %d on", pid, pgrp, start, ownGroup, ownStart)
	}
	if ppid, err := parentOf(pid); err != nil || ppid != os.Getpid() {
		t.Errorf("parentOf(%d) = %d, %v; want %d", pid, ppid, err, os.Getpid())
	}

	// Killed and not reaped (nothing waits for it yet): a zombie.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for _, _, err := procStat(pid); err == nil; _, _, err = procStat(pid) {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("procStat of a killed process still answers")
		}
	}
	if ppid, err := parentOf(pid); err != nil || ppid != os.Getpid() {
		t.Errorf("parentOf(%d) of the zombie = %d, %v; want %d", pid, ppid, err, os.Getpid())
	}
	cmd.Wait()
	if _, _, err := procStat(pid); err == nil {
		t.Errorf("procStat of a reaped process: no error")
	}
}

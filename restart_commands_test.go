//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/needs"
	"kernelgate/jupyter"
	"kernelgate/state"
)

// These tests run commands beside a context's kernel that a restarted
// gateway adopted: the same workspace, environment, cgroup and sandbox as
// before the restart, and the command ends with the kernel.

// cmdExecution is the Execution of a command.
type cmdExecution struct {
	ID   string `json:"id"`
	Logs struct {
		Stdout []string `json:"stdout"`
		Stderr []string `json:"stderr"`
	} `json:"logs"`
	Process struct {
		ExitCode *int   `json:"exitCode"`
		Reason   string `json:"reason"`
		Message  string `json:"message"`
	} `json:"process"`
}

func (e cmdExecution) stdout() string { return strings.Join(e.Logs.Stdout, "") }

func (e cmdExecution) exit() string {
	if e.Process.ExitCode == nil {
		return e.Process.Reason + "/none"
	}
	return fmt.Sprintf("%s/%d", e.Process.Reason, *e.Process.ExitCode)
}

// postCommand sends POST /api/contexts/{id}/commands and returns the
// status and body.
func postCommand(t *testing.T, url, ctx string, body map[string]any) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+"api/contexts/"+ctx+"/commands", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// runCommand runs a command to its end in a context.
func runCommand(t *testing.T, url, ctx, cmd string) cmdExecution {
	t.Helper()
	status, out := postCommand(t, url, ctx, map[string]any{"cmd": cmd})
	var e cmdExecution
	if status != http.StatusOK || json.Unmarshal(out, &e) != nil {
		t.Fatalf("command %q in %s: %d %s", cmd, ctx, status, out)
	}
	return e
}

// commandRun reads GET /api/runs/{id} of a command.
func commandRun(t *testing.T, url, id string) (string, cmdExecution) {
	t.Helper()
	var m struct {
		State     string       `json:"state"`
		Execution cmdExecution `json:"execution"`
	}
	call(t, "GET", url+"api/runs/"+id, nil, 200, &m)
	return m.State, m.Execution
}

// adoptedCommandProbe is what a command prints of where it runs: the
// file the kernel wrote, the context's variable, its folder, HOME, its
// user and whether it sees the gateway's state directory.
func adoptedCommandProbe(stateDir string) string {
	return fmt.Sprintf("cat from-kernel.txt; echo; echo $MY_SETTING; pwd; echo $HOME; id -u; ulimit -n; test -e %s && echo state-visible || echo state-hidden", stateDir)
}

// kernelView is what the kernel itself says of the same: its folder,
// HOME and user.
func kernelView(t *testing.T, url, ctx string) []string {
	t.Helper()
	e := execute(t, url, ctx, "import os\nkept = 41\nopen('from-kernel.txt', 'w').write('written by the kernel')\nprint(os.getcwd()); print(os.environ['HOME']); print(os.getuid())")
	got := strings.Fields(strings.Join(e.Logs.Stdout, ""))
	if len(got) != 3 {
		t.Fatalf("the kernel's view: %+v", e)
	}
	return got
}

// The limits of the kernels of these tests: open files (RLIMIT_NOFILE)
// and processes (cgroup).
const (
	testNoFile = 1234
	testPids   = 300
)

// limitArgs are the flags of those limits.
var limitArgs = []string{"--kernel-nofile", fmt.Sprint(testNoFile), "--kernel-pids", fmt.Sprint(testPids)}

// checkAdoptedCommands runs commands in ctx, whose kernel is pid, before
// and after the gateway g is SIGKILLed and started again (by restart) on
// the same state: after the restart they run as before, in the kernel's
// cgroup, and a command still running ends with the kernel. It returns
// the gateway started last.
func checkAdoptedCommands(t *testing.T, g *gatewayProcess, restart func() *gatewayProcess, ctx string, pid int, stateDir string, sandboxed bool) *gatewayProcess {
	t.Helper()
	view := kernelView(t, g.url, ctx)
	cgroup, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	probe := adoptedCommandProbe(stateDir) + "; cat /proc/self/cgroup"
	before := runCommand(t, g.url, ctx, probe+"; exit 3")
	want := fmt.Sprintf("written by the kernel\nv1\n%s\n%s\n%s\n%s\n", view[0], view[1], view[2], fmt.Sprint(testNoFile))
	if sandboxed {
		want += "state-hidden\n"
	} else {
		// A sandbox has a cgroup namespace of its own: there, a command's
		// cgroup is compared with the one it had before the restart.
		want += "state-visible\n" + string(cgroup)
	}
	if !strings.HasPrefix(before.stdout(), want) || before.exit() != "completed/3" {
		t.Fatalf("a command before the restart: %s %q, want completed/3 %q (stderr %q)", before.exit(), before.stdout(), want, before.Logs.Stderr)
	}
	g.kill(t, syscall.SIGKILL)

	g2 := restart()
	if e := execute(t, g2.url, ctx, "kept + 1"); e.text() != "42" {
		t.Fatalf("the context's kernel after the restart was not adopted: %+v\n%s", e, g2.logs)
	}
	after := runCommand(t, g2.url, ctx, probe+"; echo from-command > from-command.txt; exit 7")
	if after.stdout() != before.stdout() || after.exit() != "completed/7" {
		t.Fatalf("a command beside the adopted kernel: %s %q, want completed/7 %q as before the restart (stderr %q)\n%s", after.exit(), after.stdout(), before.stdout(), after.Logs.Stderr, g2.logs)
	}
	if e := execute(t, g2.url, ctx, "open('from-command.txt').read()"); e.text() != `'from-command\n'` {
		t.Fatalf("the kernel read the command's file as %+v", e)
	}

	if !strings.Contains(string(cgroup), "/kernelgate/") {
		needs.Skip(t, "the kernel is in no cgroup of kernelgate's (no writable cgroups here): %s", cgroup)
	}
	// The kernel's process limit holds for a command beside the adopted
	// kernel: it cannot start testPids processes.
	status, out := postCommand(t, g2.url, ctx, map[string]any{"timeout": 30,
		"cmd": fmt.Sprintf("i=0; while [ $i -lt %d ]; do sleep 60 & i=$((i+1)); done; echo started $i", testPids)})
	var bomb cmdExecution
	if status != http.StatusOK || json.Unmarshal(out, &bomb) != nil {
		t.Fatalf("many processes: %d %s", status, out)
	}
	if bomb.exit() == "completed/0" || strings.Contains(bomb.stdout(), "started") || !strings.Contains(strings.Join(bomb.Logs.Stderr, ""), "fork") {
		t.Fatalf("a command beside the adopted kernel started %d processes: %s %q %q", testPids, bomb.exit(), bomb.stdout(), bomb.Logs.Stderr)
	}
	waitFor(t, func() bool { return len(procsWithArgs("sleep", "60")) == 0 },
		"the processes of a command that ended are left: %v", func() []any { return []any{procsWithArgs("sleep", "60")} })
	if e := execute(t, g2.url, ctx, "kept * 2"); e.text() != "82" {
		t.Fatalf("the kernel after its command met the process limit: %+v", e)
	}

	// A command still running ends when the adopted kernel does (its
	// cgroup is killed).
	marker := fmt.Sprint(3000 + time.Now().UnixNano()%100000)
	status, out = postCommand(t, g2.url, ctx, map[string]any{"cmd": []string{"sleep", marker}, "background": true})
	var bg struct {
		Run string `json:"run"`
	}
	if status != http.StatusAccepted || json.Unmarshal(out, &bg) != nil {
		t.Fatalf("background command: %d %s", status, out)
	}
	var sleepers []int
	waitFor(t, func() bool { sleepers = procsWithArgs("sleep", marker); return len(sleepers) > 0 },
		"processes of the background command: %v", func() []any { return []any{sleepers} })
	syscall.Kill(pid, syscall.SIGKILL)
	var runState string
	var e cmdExecution
	waitFor(t, func() bool { runState, e = commandRun(t, g2.url, bg.Run); return runState == "done" },
		"the command's run after its kernel died: %s %+v", func() []any { return []any{runState, e} })
	if e.Process.Reason != "lost" {
		t.Errorf("the command of a kernel that died: %+v", e.Process)
	}
	waitFor(t, func() bool { return len(procsWithArgs("sleep", marker)) == 0 },
		"the command %v outlived its adopted kernel", func() []any { return []any{sleepers} })
	return g2
}

// procsWithArgs lists the live processes whose command line is argv,
// argv[0] possibly resolved to a path.
func procsWithArgs(argv ...string) []int {
	want := []byte(strings.Join(argv, "\x00") + "\x00")
	var out []int
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !(bytes.Equal(cmd, want) || bytes.HasSuffix(cmd, append([]byte("/"), want...))) {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err != nil || strings.Contains(string(st), ") Z ") {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// TestCommandsBesideAdoptedKernel: a context's kernel adopted by a
// gateway started again after a crash runs commands as before: in its
// workspace (a file the kernel wrote, one the kernel reads), with the
// context's env and the kernel's HOME, in its cgroup, with their exit
// codes; a command ends when the adopted kernel dies.
func TestCommandsBesideAdoptedKernel(t *testing.T) {
	bin := buildBinary(t)
	dirs := newRestartDirs(t)
	args := append([]string{"--pool-size", "0"}, limitArgs...)
	g := dirs.start(t, bin, args...)
	var c ctxModel
	call(t, "POST", g.url+"api/contexts", map[string]any{"id": "agent", "language": "python", "env": map[string]string{"MY_SETTING": "v1"}}, 201, &c)
	g2 := checkAdoptedCommands(t, g, func() *gatewayProcess { return dirs.start(t, bin, args...) }, "agent", *c.KernelProcessID, dirs.state, false)
	if err := g2.kill(t, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitProcs(t, dirs.runtime, true, nil)
}

// TestCommandsBesideAdoptedSandboxedKernel: a sandboxed (bubblewrap)
// kernel adopted after a crash runs commands in the same sandbox: as the
// kernel's user, in its workspace, hiding what the kernel's sandbox
// hides.
func TestCommandsBesideAdoptedSandboxedKernel(t *testing.T) {
	needBwrap(t)
	bin := buildBinary(t)
	// The sandbox user reaches the kernels' directories: outside /tmp.
	root := hostDir(t)
	dirs := restartDirs{state: filepath.Join(t.TempDir(), "state"), runtime: filepath.Join(root, "runtime")}
	t.Cleanup(func() {
		for _, pid := range kernelProcs(dirs.runtime, true) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	args := append([]string{"--pool-size", "0", "--sandbox", "--sandbox-network", "--workspace-root", filepath.Join(root, "workspaces")}, limitArgs...)
	g := dirs.start(t, bin, args...)
	var c ctxModel
	call(t, "POST", g.url+"api/contexts", map[string]any{"id": "boxed", "language": "python", "env": map[string]string{"MY_SETTING": "v1"}}, 201, &c)
	g2 := checkAdoptedCommands(t, g, func() *gatewayProcess { return dirs.start(t, bin, args...) }, "boxed", *c.KernelProcessID, dirs.state, true)
	if err := g2.kill(t, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitProcs(t, dirs.runtime, true, nil)
}

// TestCommandsBesideKernelKeptByEarlierVersion: a kernel kept by an
// earlier version, whose info says nothing of commands, is adopted and
// runs code; a command beside it answers 409 UNSUPPORTED_OPERATION,
// saying to restart the context.
func TestCommandsBesideKernelKeptByEarlierVersion(t *testing.T) {
	bin := buildBinary(t)
	dirs := newRestartDirs(t)
	g := dirs.start(t, bin, "--pool-size", "0", "--keep-kernels")
	var c ctxModel
	call(t, "POST", g.url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, &c)
	execute(t, g.url, "agent", "x = 41")
	if e := runCommand(t, g.url, "agent", "true"); e.exit() != "completed/0" {
		t.Fatalf("a command before the restart: %+v", e)
	}
	if err := g.kill(t, syscall.SIGTERM); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, g.logs)
	}
	waitProcs(t, dirs.runtime, false, []int{*c.KernelProcessID})

	// Rewrite the kept kernel's info as the earlier version wrote it:
	// without "command".
	rewriteKeptKernels(t, dirs.state, func(k state.Kernel, info jupyter.ProvisionerInfo) ([]byte, error) {
		var data map[string]json.RawMessage
		if err := json.Unmarshal(info.Data, &data); err != nil || data["command"] == nil {
			t.Fatalf("kernel %s: info %s holds no command plan (%v)", k.ID, info.Data, err)
		}
		delete(data, "command")
		var err error
		if info.Data, err = json.Marshal(data); err != nil {
			return nil, err
		}
		return info.Marshal()
	})

	g2 := dirs.start(t, bin, "--pool-size", "0")
	if e := execute(t, g2.url, "agent", "import os\n(x, os.getpid())"); e.text() != fmt.Sprintf("(41, %d)", *c.KernelProcessID) {
		t.Fatalf("the context whose kernel an earlier version kept: %+v\n%s", e, g2.logs)
	}
	status, out := postCommand(t, g2.url, "agent", map[string]any{"cmd": "true"})
	if status != http.StatusConflict || !strings.Contains(string(out), `"UNSUPPORTED_OPERATION"`) || !strings.Contains(string(out), "restart the context") {
		t.Fatalf("a command beside a kernel kept by an earlier version: %d %s", status, out)
	}
	// Restarting the context gives it a kernel that runs commands.
	call(t, "POST", g2.url+"api/contexts/agent/restart", nil, 200, nil)
	if e := runCommand(t, g2.url, "agent", "exit 5"); e.exit() != "completed/5" {
		t.Fatalf("a command after the context restarted: %+v", e)
	}
}

// needBwrap skips unless bubblewrap can sandbox here.
func needBwrap(t *testing.T) {
	t.Helper()
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		bwrap = "/usr/bin/bwrap"
	}
	if out, err := exec.Command(bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--", "/bin/true").CombinedOutput(); err != nil {
		needs.Skip(t, "bubblewrap cannot sandbox here: %v: %s", err, out)
	}
}

// hostDir is a fresh directory outside /tmp and /var/tmp, which every
// sandbox hides, removed at the end of the test.
func hostDir(t *testing.T) string {
	t.Helper()
	for _, parent := range []string{"/var/lib", os.Getenv("HOME")} {
		if parent == "" {
			continue
		}
		if dir, err := os.MkdirTemp(parent, "kernelgate-test-"); err == nil {
			os.Chmod(dir, 0o755)
			t.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	needs.Skip(t, "no writable directory outside /tmp")
	return ""
}

//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kernelgate/internal/testkernels"
	"kernelgate/kernelspecs"

	"kernelgate/jupyter"
)

// settledSnapshot counts resources once the process-wide launch thread
// (zygote.go), which lives as long as the process, exists.
func settledSnapshot(t *testing.T) resources {
	startOnParentThread(exec.Command("/nonexistent/kernelgate-warm-up")) // fails to start: no process
	return snapshot(t)
}

// resultText runs code and returns the text/plain of its execute_result.
func resultText(t *testing.T, k *jupyter.Kernel, code string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newCollector()
	if _, err := k.Execute(ctx, code, c.handle); err != nil {
		t.Fatalf("execute %q: %v", code, err)
	}
	res := c.ofType(jupyter.ExecuteResult)
	if len(res) != 1 {
		t.Fatalf("execute %q: %d results", code, len(res))
	}
	var content struct {
		Data map[string]string `json:"data"`
	}
	if err := res[0].DecodeContent(&content); err != nil {
		t.Fatal(err)
	}
	return content.Data["text/plain"]
}

// launcherSpec is the python3 kernelspec whose kernels are forked from a
// zygote (LauncherFork, preloading testkernels.Preload) or exec'd.
func launcherSpec(t *testing.T, launcher string) *kernelspecs.Spec {
	t.Helper()
	if launcher == LauncherFork {
		return forkSpec(t)
	}
	dir := testkernels.WithLauncher(t, testkernels.Dir(t), LauncherExec, nil)
	s, err := kernelspecs.Load([]string{dir}).Get("python3")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// eachLauncher runs f for a forked and for an exec'd python3 kernelspec.
func eachLauncher(t *testing.T, f func(t *testing.T, launcher string, spec *kernelspecs.Spec)) {
	for _, l := range []string{LauncherFork, LauncherExec} {
		t.Run(l, func(t *testing.T) { f(t, l, launcherSpec(t, l)) })
	}
}

// checkLauncher fails unless k was started the way launcher says.
func checkLauncher(t *testing.T, launcher string, k *jupyter.Kernel) {
	t.Helper()
	if _, forked := k.Process().(*forkedProcess); forked != (launcher == LauncherFork) {
		t.Fatalf("a %s kernel started as %T", launcher, k.Process())
	}
}

// TestReconnect is a gateway restart in one process: a detached python
// kernel, forked or exec'd, is started, its provisioner info saved and its
// client dropped without stopping it; a new client built from the saved
// info alone finds its state. Info that names another process (start
// time) or another key is refused and leaves the kernel alone. Killed, the
// adopted kernel (not a child of its client) is seen to die.
func TestReconnect(t *testing.T) { eachLauncher(t, testReconnect) }

func testReconnect(t *testing.T, launcher string, spec *kernelspecs.Spec) {
	before := settledSnapshot(t)
	p := &Provisioner{RuntimeDir: t.TempDir(), Detached: true}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	k1, err := jupyter.Start(ctx, p, jupyter.Config{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	checkLauncher(t, launcher, k1)
	pid := k1.PID()
	if got := resultText(t, k1, "x = 41; x"); got != "41" {
		t.Fatalf("x = %q", got)
	}
	info, err := k1.ProvisionerInfo()
	if err != nil {
		t.Fatal(err)
	}
	saved, err := info.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	// Not tied to this process: no parent poller, a session of its own.
	environ, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if strings.Contains(string(environ), "JPY_PARENT_PID=") {
		t.Error("a detached kernel has JPY_PARENT_PID")
	}
	if sid, _ := unix.Getsid(pid); sid != pid {
		t.Errorf("kernel session %d, want its own (%d)", sid, pid)
	}
	k1.Detach()
	if !errors.Is(k1.Err(), jupyter.ErrKernelDetached) {
		t.Errorf("the dropped client ended with %v", k1.Err())
	}
	if syscall.Kill(pid, 0) != nil {
		t.Fatal("dropping the client ended the kernel")
	}

	loaded, err := jupyter.UnmarshalProvisionerInfo(saved)
	if err != nil {
		t.Fatal(err)
	}
	// A process that is not the kernel's (another start time) is refused.
	wrongLocal := *localOf(t, loaded)
	wrongLocal.StartTime++
	wrong := withLocal(t, loaded, &wrongLocal)
	if _, err := jupyter.Reconnect(ctx, p, wrong, jupyter.Config{ID: k1.ID(), Spec: spec}); !errors.Is(err, jupyter.ErrNotAdoptable) {
		t.Errorf("another start time: %v, want ErrNotAdoptable", err)
	}
	// A kernel that does not sign with the stored key never answers.
	badKey := loaded
	badKey.Connection.Key = jupyter.NewKey()
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	_, err = jupyter.Reconnect(short, p, badKey, jupyter.Config{ID: k1.ID(), Spec: spec})
	cancelShort()
	if !errors.Is(err, jupyter.ErrConnectFailed) {
		t.Errorf("another key: %v, want ErrConnectFailed", err)
	}
	if syscall.Kill(pid, 0) != nil {
		t.Fatal("a refused adoption ended the kernel")
	}

	k2, err := jupyter.Reconnect(ctx, p, loaded, jupyter.Config{ID: k1.ID(), Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	defer k2.Shutdown(context.Background())
	if k2.PID() != pid {
		t.Errorf("reconnected to pid %d, want %d", k2.PID(), pid)
	}
	if got := resultText(t, k2, "x + 1"); got != "42" {
		t.Errorf("the kernel's state after reconnecting: x + 1 = %q, want 42", got)
	}

	// The adopted kernel is not our client's child: its death is learnt
	// from its pidfd.
	syscall.Kill(pid, syscall.SIGKILL)
	select {
	case <-k2.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the adopted kernel's death went unnoticed")
	}
	var died *jupyter.DiedError
	if !errors.As(k2.Err(), &died) || died.Status != ExitUnknown {
		t.Errorf("died with %v, want a DiedError of status %q", k2.Err(), ExitUnknown)
	}
	k2.Shutdown(context.Background())
	if _, err := os.Stat(localOf(t, loaded).RuntimeDir); !os.IsNotExist(err) {
		t.Errorf("the kernel's directory is still there: %v", err)
	}
	checkNoLeaks(t, before)
}

// TestAdoptRefusesReusedPid: a pid whose process is another one now (a
// start time that differs) is never adopted.
func TestAdoptRefusesReusedPid(t *testing.T) {
	self, err := processStart(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	p := &Provisioner{}
	li := &Info{PID: os.Getpid(), PGID: os.Getpid(), StartTime: self + 1, BootID: bootID()}
	info := withLocal(t, jupyter.ProvisionerInfo{Provisioner: InfoName}, li)
	if _, err := p.Adopt(context.Background(), info); !errors.Is(err, jupyter.ErrNotAdoptable) {
		t.Errorf("a mismatching start time: %v, want ErrNotAdoptable", err)
	}
	li.StartTime = self
	li.BootID = "another-boot"
	info = withLocal(t, info, li)
	if _, err := p.Adopt(context.Background(), info); !errors.Is(err, jupyter.ErrNotAdoptable) {
		t.Errorf("another boot: %v, want ErrNotAdoptable", err)
	}
	li.PID = 1 << 22 // above pid_max
	li.BootID = ""
	info = withLocal(t, info, li)
	if _, err := p.Adopt(context.Background(), info); !errors.Is(err, jupyter.ErrNotAdoptable) {
		t.Errorf("no such process: %v, want ErrNotAdoptable", err)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll(within, cond) {
		t.Fatalf("%s: not within %v", what, within)
	}
}

// poll calls cond until it holds (true) or within has passed (false): for
// what has no event to wait on, such as /proc.
func poll(within time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			return cond()
		}
	}
	return true
}

func leaseUntil(t *testing.T, info jupyter.ProvisionerInfo) int64 {
	b, err := os.ReadFile(localOf(t, info).Lease)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// TestOrphanWatchdog: a detached kernel, forked or exec'd, whose client
// is dropped and that no gateway adopts again is stopped by its watchdog
// once its lease runs out, its directory removed; one adopted again in
// time (a rolling restart) lives on past its first lease.
func TestOrphanWatchdog(t *testing.T) { eachLauncher(t, testOrphanWatchdog) }

func testOrphanWatchdog(t *testing.T, launcher string, spec *kernelspecs.Spec) {
	before := settledSnapshot(t)
	// The lease is renewed every third of the timeout and counted in whole
	// seconds. With 2 s, a kernel still starting on a loaded machine was
	// once stopped by SIGTERM 2-3 s after its launch, the window of a
	// renewal more than 1.3 s late. The gateway takes no less than 10 s.
	p := &Provisioner{RuntimeDir: t.TempDir(), Detached: true, OrphanTimeout: 5 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	start := func() (*jupyter.Kernel, jupyter.ProvisionerInfo) {
		k, err := jupyter.Start(ctx, p, jupyter.Config{Spec: spec})
		if err != nil {
			t.Fatal(err)
		}
		checkLauncher(t, launcher, k)
		info, err := k.ProvisionerInfo()
		if err != nil {
			t.Fatal(err)
		}
		if localOf(t, info).Lease == "" || localOf(t, info).WatchdogPID == 0 || leaseUntil(t, info) < time.Now().Unix() {
			t.Fatalf("no lease or watchdog: %+v", localOf(t, info))
		}
		return k, info
	}

	// Rolling restart: dropped, then adopted again at once.
	kept, keptInfo := start()
	firstLease := leaseUntil(t, keptInfo)
	kept.Detach()
	k2, err := jupyter.Reconnect(ctx, p, keptInfo, jupyter.Config{ID: kept.ID(), Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	defer k2.Shutdown(context.Background())

	// Orphan: dropped for good.
	orphan, orphanInfo := start()
	orphanLease := leaseUntil(t, orphanInfo)
	orphan.Detach()
	pid := localOf(t, orphanInfo).PID
	waitFor(t, 30*time.Second, "the orphan is stopped", func() bool {
		s, err := processStart(pid)
		return err != nil || s != localOf(t, orphanInfo).StartTime
	})
	waitFor(t, 10*time.Second, "the orphan's directory is removed", func() bool {
		_, err := os.Stat(localOf(t, orphanInfo).RuntimeDir)
		return os.IsNotExist(err)
	})
	if time.Now().Unix() <= orphanLease {
		t.Fatalf("the orphan was stopped before its lease ran out")
	}
	// By now the kept kernel's first lease has run out too.
	waitFor(t, 10*time.Second, "the kept kernel's first lease ran out", func() bool { return time.Now().Unix() > firstLease+1 })
	if got := resultText(t, k2, "1 + 1"); got != "2" {
		t.Errorf("the adopted kernel after its first lease: %q", got)
	}
	if leaseUntil(t, keptInfo) <= firstLease {
		t.Error("the adopting gateway did not renew the lease")
	}
	k2.Shutdown(context.Background())
	checkNoLeaks(t, before)
}

// TestReconnectSandboxed: a detached kernel in bubblewrap (ipc transport)
// is not tied to the gateway either (no --die-with-parent), and is
// reconnected with its state; a sandbox bridged over tcp, whose bridge
// lives in the gateway, is refused without being touched.
func TestReconnectSandboxed(t *testing.T) {
	needSandbox(t)
	before := settledSnapshot(t)
	spec := testkernels.Spec(t, "python3")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	p := &Provisioner{RuntimeDir: sandboxRuntime(t), Transport: "ipc", Sandbox: &SandboxConfig{}, Detached: true}
	k1, err := jupyter.Start(ctx, p, jupyter.Config{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	if got := resultText(t, k1, "y = 5; y"); got != "5" {
		t.Fatalf("y = %q", got)
	}
	cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(k1.PID()) + "/cmdline")
	if strings.Contains(string(cmdline), "--die-with-parent") {
		t.Error("a detached sandbox dies with its parent")
	}
	info, err := k1.ProvisionerInfo()
	if err != nil {
		t.Fatal(err)
	}
	k1.Detach()
	k2, err := jupyter.Reconnect(ctx, p, info, jupyter.Config{ID: k1.ID(), Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	if got := resultText(t, k2, "y * 2"); got != "10" {
		t.Errorf("y * 2 = %q after reconnecting", got)
	}
	if !interruptsByMessage(k2.Process()) {
		t.Error("an adopted sandbox would be interrupted by a signal to bwrap")
	}
	k2.Shutdown(context.Background())

	bridged := &Provisioner{RuntimeDir: sandboxRuntime(t), Sandbox: &SandboxConfig{}, Detached: true}
	k3, err := jupyter.Start(ctx, bridged, jupyter.Config{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	defer k3.Shutdown(context.Background())
	info3, err := k3.ProvisionerInfo()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bridged.Adopt(ctx, info3); !errors.Is(err, jupyter.ErrNotAdoptable) {
		t.Errorf("a bridged sandbox: %v, want ErrNotAdoptable", err)
	}
	if got := resultText(t, k3, "1 + 2"); got != "3" {
		t.Errorf("the refused kernel is hurt: %q", got)
	}
	k3.Shutdown(context.Background())
	checkNoLeaks(t, before)
}

// gatewayHelperEnv makes TestHelperGateway a gateway that starts a
// detached kernel in the runtime directory it names, prints the kernel's
// provisioner info and dies by SIGKILL; gatewayLauncherEnv says how the
// kernel starts (LauncherFork or LauncherExec).
const (
	gatewayHelperEnv   = "KERNELGATE_TEST_GATEWAY_RUNTIME"
	gatewayLauncherEnv = "KERNELGATE_TEST_GATEWAY_LAUNCHER"
)

func TestHelperGateway(t *testing.T) {
	dir := os.Getenv(gatewayHelperEnv)
	if dir == "" {
		t.Skip("run by TestReconnectAfterGatewayDied")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	launcher := os.Getenv(gatewayLauncherEnv)
	p := &Provisioner{RuntimeDir: dir, Detached: true}
	k, err := jupyter.Start(ctx, p, jupyter.Config{Spec: launcherSpec(t, launcher)})
	if err != nil {
		t.Fatal(err)
	}
	checkLauncher(t, launcher, k)
	if got := resultText(t, k, "z = 7; print('to stdout of the kernel'); z"); got != "7" {
		t.Fatalf("z = %q", got)
	}
	info, err := k.ProvisionerInfo()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := info.Marshal()
	os.Stdout.Write(append(b, '\n'))
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
}

// TestReconnectAfterGatewayDied: a gateway process starts a detached
// kernel, forked or exec'd, and is killed; the kernel lives on, no longer
// a child of anyone here, and a client made from the saved info alone
// finds its state and learns of its death.
func TestReconnectAfterGatewayDied(t *testing.T) { eachLauncher(t, testReconnectAfterGatewayDied) }

func testReconnectAfterGatewayDied(t *testing.T, launcher string, spec *kernelspecs.Spec) {
	before := settledSnapshot(t)
	runtime := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperGateway$")
	cmd.Env = append(os.Environ(), gatewayHelperEnv+"="+runtime, gatewayLauncherEnv+"="+launcher)
	out, _ := cmd.Output()
	var saved string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "{") {
			saved = line
		}
	}
	if saved == "" {
		t.Fatalf("the gateway printed no provisioner info:\n%s", out)
	}
	info, err := jupyter.UnmarshalProvisionerInfo([]byte(saved))
	if err != nil {
		t.Fatal(err)
	}
	pid := localOf(t, info).PID
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) }) // if the test fails half way
	if s, err := processStart(pid); err != nil || s != localOf(t, info).StartTime {
		t.Fatalf("the kernel did not outlive its gateway: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := &Provisioner{RuntimeDir: runtime, Detached: true}
	k, err := jupyter.Reconnect(ctx, p, info, jupyter.Config{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Shutdown(context.Background())
	if got := resultText(t, k, "z * 6"); got != "42" {
		t.Errorf("z * 6 = %q after the gateway died", got)
	}
	if ppid, err := parentOf(pid); err != nil || ppid == os.Getpid() {
		t.Errorf("the kernel's parent is %d (%v): it should not be this process", ppid, err)
	}
	// Its stdout and stderr went to its output file, not to the dead
	// gateway's pipe.
	if out := k.Output(); !strings.Contains(out, "--existing") {
		t.Errorf("the kernel's output after the gateway died: %q", out)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	select {
	case <-k.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the death of a kernel that is not our child went unnoticed")
	}
	var died *jupyter.DiedError
	if !errors.As(k.Err(), &died) || died.Status != ExitUnknown {
		t.Errorf("died with %v, want status %q", k.Err(), ExitUnknown)
	}
	k.Shutdown(context.Background())
	if _, err := os.Stat(localOf(t, info).RuntimeDir); !os.IsNotExist(err) {
		t.Errorf("the kernel's directory is still there: %v", err)
	}
	waitFor(t, 10*time.Second, "the watchdog is stopped", func() bool {
		s, err := processStart(localOf(t, info).WatchdogPID)
		return err != nil || s != localOf(t, info).WatchdogStart
	})
	checkNoLeaks(t, before)
}

// TestReconnectBusyKernel: a kept kernel busy with a long request is
// connected to while it runs, though it publishes nothing (Deno answers
// kernel_info on control but publishes no status for it); a kept kernel
// that signs its output with another key than the recorded one fails at
// once, not when the wait ends.
func TestReconnectBusyKernel(t *testing.T) {
	before := settledSnapshot(t)
	p := &Provisioner{RuntimeDir: t.TempDir(), Detached: true}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// busy starts a kernel of spec, sends it code and drops the client:
	// the kernel goes on running it. It returns the kernel's info.
	busy := func(spec, code string) jupyter.ProvisionerInfo {
		t.Helper()
		k, err := jupyter.Start(ctx, p, jupyter.Config{Spec: testkernels.Spec(t, spec)})
		if err != nil {
			t.Fatal(err)
		}
		info, err := k.ProvisionerInfo()
		if err != nil {
			t.Fatal(err)
		}
		c := newCollector()
		if _, err := k.StartExecute(jupyter.NewExecute(code), c.handle); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "the code to start", func() bool { return len(c.ofType(jupyter.StreamMsg)) > 0 })
		k.Detach()
		t.Cleanup(func() { jupyter.Stop(context.Background(), p, info, time.Second) })
		return info
	}

	gate := filepath.Join(t.TempDir(), "gate")
	deno := busy("deno", fmt.Sprintf("console.log('started');\nwhile (!(await Deno.stat(%q).then(() => true, () => false))) await new Promise((r) => setTimeout(r, 50));\n42", gate))
	k, err := jupyter.Reconnect(ctx, p, deno, jupyter.Config{Spec: testkernels.Spec(t, "deno")})
	if err != nil {
		t.Fatalf("connecting to a busy Deno kernel: %v", err)
	}
	os.WriteFile(gate, nil, 0o600)
	if got := resultText(t, k, "1 + 1"); !strings.Contains(got, "2") {
		t.Errorf("the Deno kernel after its busy run: 1 + 1 = %q", got)
	}
	k.Shutdown(context.Background())

	python := busy("python3", "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.05)")
	python.Connection.Key = jupyter.NewKey()
	_, err = jupyter.Reconnect(ctx, p, python, jupyter.Config{Spec: testkernels.Spec(t, "python3")})
	if !errors.Is(err, jupyter.ErrWrongKey) || ctx.Err() != nil {
		t.Errorf("a kernel signing with another key: %v, want ErrWrongKey", err)
	}
	if syscall.Kill(localOf(t, python).PID, 0) != nil {
		t.Error("a refused adoption ended the kernel")
	}
	jupyter.Stop(context.Background(), p, python, time.Second)
	checkNoLeaks(t, before)
}

// localOf is the local provisioner's part of pi.
func localOf(t *testing.T, pi jupyter.ProvisionerInfo) *Info {
	t.Helper()
	li, err := InfoOf(pi)
	if err != nil {
		t.Fatal(err)
	}
	return li
}

// withLocal is pi with li as its local provisioner's part.
func withLocal(t *testing.T, pi jupyter.ProvisionerInfo, li *Info) jupyter.ProvisionerInfo {
	t.Helper()
	out, err := li.provisionerInfo(pi.Connection)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

//go:build linux

package local

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"kernelgate/internal/tailbuf"
	"kernelgate/kernelspecs"

	"kernelgate/jupyter"
)

// A zygote is a Python process per kernelspec that has imported ipykernel,
// IPython and the modules the kernelspec lists (metadata.kernelgate.preload,
// e.g. ["numpy", "pandas", "matplotlib"]), started no thread and no
// ZeroMQ context, and forks one child per kernel start. The child sets up
// the environment, working directory, output, process group and limits the
// kernel would have had, and runs `python -m ipykernel_launcher -f FILE`
// in place; the imported modules stay shared, copy-on-write, between the
// zygote and every kernel. A start costs a fork and ipykernel's own
// initialisation instead of an interpreter start and its imports.
//
// How it works (zygote.py is the Python side):
//
//   - The gateway starts a zygote on the first launch of its kernelspec
//     (one per distinct python, module, preload list, environment and home
//     seed in the whole gateway process, shared by every Provisioner)
//     and waits for it to report "ready" on a pipe. It listens on a unix
//     socket in a private directory below DefaultRuntimeDir and answers
//     its parent, the gateway, only (SO_PEERCRED).
//   - A launch connects, sends the argv, environment and working directory
//     with the write end of the kernel's output pipe (SCM_RIGHTS, so the
//     output tail is fed as before), and gets the child's pid back.
//   - The zygote forks with clone(CLONE_PARENT): the kernel is the
//     gateway's child, not the zygote's. The gateway reaps it and reads its
//     exit status (through the pidfd os.FindProcess opens; the pid cannot
//     be reused before the gateway reaps it), its parent-death signal
//     (SIGKILL, as Pdeathsig for an exec'd kernel) and JPY_PARENT_PID name
//     the gateway, and the zygote dying leaves running kernels alone.
//   - The child waits at a gate (the same connection) until the gateway
//     has moved it into the kernel's cgroup and set its rlimits (prlimit),
//     then applies the environment and working directory, closes the
//     zygote's descriptors (listener, log, ready pipe), reseeds its random
//     state, reports ok, and runs the module. So the kernel runs no code of
//     its own outside its cgroup, as behind the exec gate (limits.go).
//   - The gateway keeps one spare child per zygote, forked ahead of need
//     and already moved into a cgroup of its own (spareChild): a launch
//     claims it, sets the launch's limits on that cgroup and gates it as
//     above, so it skips the fork and the cgroup move.
//   - The child calls setsid(): signals and interrupts go to its process
//     group as for an exec'd kernel, and no terminal's hangup reaches it.
//   - A detached launch (Provisioner.Detached, localinfo.go) forks a
//     kernel that outlives the gateway as a detached exec'd one does: no
//     parent-death signal, no JPY_PARENT_PID, output into a file of its
//     directory, a lease and a watchdog (orphan.go). A gateway started
//     again adopts it like any other local kernel: it is no child of the
//     zygote, whose end does not concern it.
//   - A zygote that died is noticed (reaped) at the next launch and
//     started again; that launch waits for it. A zygote that cannot start
//     (an import fails, a library leaves a thread running) is logged and
//     its kernelspec's kernels are exec'd for zygoteRetryAfter before the
//     next try. StopZygotes ends them all; they also die with the gateway
//     (Pdeathsig).
//
// Random state: random's own at-fork hook reseeds it, numpy's global
// RandomState is reseeded from the OS, os.urandom, secrets, uuid and
// tempfile need nothing. The string hash secret (PYTHONHASHSEED) is fixed
// when an interpreter starts and every cached hash depends on it, so every
// kernel forked from one zygote shares its zygote's secret: hash-based
// ordering (set iteration over strings) repeats across those kernels, and
// one kernel could learn the secret its siblings use. A restarted zygote
// has a new secret. A kernelspec that must not share it opts out.
//
// What is not forked, but exec'd as before: sandboxed kernels (bubblewrap
// builds a new mount, pid and network namespace around a fresh process),
// argv other than `<python> -m ipykernel_launcher|ipykernel ...`, and a
// kernelspec whose metadata.kernelgate.launcher is "exec" or a provisioner
// whose PythonLauncher is LauncherExec.
//
// Differences a kernel can see: variables read when a preloaded module is
// imported take the zygote's values (its environment is the kernel's
// without the per-kernel directories and the launch's own variables; a
// matplotlibrc in the kernel's start directory is not read by a preloaded
// matplotlib); sys.orig_argv names the zygote; /proc/PID/environ (the
// environment a process started with, not its current one) shows the
// zygote's. ps and /proc/PID/cmdline show the kernel's command line.

// Python kernel launchers (Provisioner.PythonLauncher).
const (
	// LauncherFork forks Python kernels from a zygote where it can.
	LauncherFork = "fork"
	// LauncherExec starts every kernel as a new process.
	LauncherExec = "exec"
)

//go:embed zygote.py
var zygoteSource string

// zygoteMarker is the zygote's argv[1], which tells it apart in ps.
const zygoteMarker = "kernelgate-zygote"

const (
	// zygoteStartWait bounds a zygote's imports.
	zygoteStartWait = 60 * time.Second
	// zygoteForkWait bounds one fork, gate and child set-up.
	zygoteForkWait = 10 * time.Second
	// zygoteRetryAfter is how long a kernelspec whose zygote failed to
	// start is exec'd before the next try.
	zygoteRetryAfter = time.Minute
	// maxZygoteFrame bounds a frame from the zygote or a child.
	maxZygoteFrame = 1 << 20
)

// zygoteModules are the modules a zygote can run as `python -m`.
var zygoteModules = map[string]bool{"ipykernel_launcher": true, "ipykernel": true}

var (
	errZygoteGone = errors.New("jupyter: zygote gone")
	errSpareGone  = errors.New("jupyter: spare child gone")
)

// zygotePlan is what a kernelspec's zygote is made of.
type zygotePlan struct {
	python, module string
	preload        []string
	env            map[string]string // spec env and BaseEnv, before the zygote's dirs
	homeSeed       string
	key            string
}

// zygotePlan says whether req's kernel can be forked, and from what.
// argv is the spec's argv with the connection file in place, path the
// kernel's PATH. The error is a kernelspec's bad metadata.
func (p *Provisioner) zygotePlan(req jupyter.LaunchRequest, iso isolation, argv []string, path string) (zygotePlan, bool, error) {
	launcher, preload, err := launchMetadata(req.Spec)
	if err != nil {
		return zygotePlan{}, false, err
	}
	if launcher == LauncherExec || p.PythonLauncher == LauncherExec || iso.sandbox != nil ||
		len(argv) < 3 || argv[1] != "-m" || !zygoteModules[argv[2]] {
		return zygotePlan{}, false, nil
	}
	python, err := lookPath(argv[0], path)
	if err != nil {
		return zygotePlan{}, false, nil // the exec path reports it
	}
	plan := zygotePlan{python: python, module: argv[2], preload: preload, env: map[string]string{}, homeSeed: p.HomeSeed}
	for _, kv := range p.BaseEnv {
		if k, v, ok := strings.Cut(kv, "="); ok {
			plan.env[k] = v
		}
	}
	for k, v := range req.Spec.Env {
		plan.env[k] = v
	}
	b, _ := json.Marshal([]any{plan.python, plan.module, plan.preload, envList(plan.env), plan.homeSeed})
	plan.key = string(b)
	return plan, true, nil
}

// launchMetadata reads metadata.kernelgate.launcher ("fork" or "exec") and
// metadata.kernelgate.preload (module names) of a kernelspec.
func launchMetadata(spec *kernelspecs.Spec) (launcher string, preload []string, err error) {
	md, _ := spec.Metadata["kernelgate"].(map[string]any)
	switch v := md["launcher"].(type) {
	case nil:
	case string:
		if v != LauncherFork && v != LauncherExec {
			return "", nil, fmt.Errorf("kernelspec %s: metadata.kernelgate.launcher %q is neither fork nor exec", spec.Name, v)
		}
		launcher = v
	default:
		return "", nil, fmt.Errorf("kernelspec %s: metadata.kernelgate.launcher is not a string", spec.Name)
	}
	if list, ok := md["preload"].([]any); ok {
		for _, x := range list {
			name, ok := x.(string)
			if !ok || !isModuleName(name) {
				return "", nil, fmt.Errorf("kernelspec %s: metadata.kernelgate.preload holds %v, not a module name", spec.Name, x)
			}
			preload = append(preload, name)
		}
	}
	return launcher, preload, nil
}

// isModuleName accepts dotted Python identifiers (ASCII).
func isModuleName(s string) bool {
	for _, part := range strings.Split(s, ".") {
		if part == "" || part[0] >= '0' && part[0] <= '9' {
			return false
		}
		for _, r := range part {
			if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
				return false
			}
		}
	}
	return true
}

// launchForked forks the kernel of req from its zygote, gives a detached
// one its lease and watchdog and records its process in its directory. It
// returns a nil Process and nil error when the kernel is to be exec'd
// instead: it cannot be forked or no zygote is available.
func (p *Provisioner) launchForked(ctx context.Context, req jupyter.LaunchRequest, iso isolation, lp *localProcess, argv []string, env map[string]string, startDir string) (jupyter.Process, error) {
	fp, err := p.forkKernel(ctx, req, iso, lp, argv, env, startDir)
	if fp == nil || err != nil {
		return nil, err
	}
	if p.Detached {
		if fp.guard, err = guardOrphan(fp.pid, fp.dir, fp.cg, p.guardTimeout(), p.logger()); err != nil {
			fp.Signal(syscall.SIGKILL)
			<-fp.Done()
			return nil, fmt.Errorf("orphan watchdog: %v", err)
		}
	}
	p.recordOwner(fp.dir, req.KernelID, fp.pid, fp.cg)
	return fp, nil
}

// forkKernel forks the kernel of req, or returns nil and nil.
func (p *Provisioner) forkKernel(ctx context.Context, req jupyter.LaunchRequest, iso isolation, lp *localProcess, argv []string, env map[string]string, startDir string) (*forkedProcess, error) {
	plan, ok, err := p.zygotePlan(req, iso, argv, env["PATH"])
	if !ok {
		return nil, err
	}
	argv = append([]string{plan.python}, argv[1:]...)
	for attempt := 0; attempt < 2; attempt++ {
		z, err := zygotes.get(ctx, plan, p.logger())
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, nil // logged when the start failed
		}
		if s := z.takeSpare(); s != nil {
			fp, err := z.fork(ctx, lp, s, argv, env, startDir, iso.limits, p.Detached)
			z.refill()
			switch {
			case err == nil:
				return fp, nil
			case !errors.Is(err, errSpareGone):
				return nil, err
			}
		}
		fp, err := z.fork(ctx, lp, nil, argv, env, startDir, iso.limits, p.Detached)
		if errors.Is(err, errZygoteGone) {
			z.gone()
			continue
		}
		z.refill()
		if err != nil {
			return nil, err
		}
		return fp, nil
	}
	return nil, nil
}

// --- the zygotes of this process ---

// zygotes are every zygote of the gateway process, by plan key.
var zygotes = &zygoteSet{slots: map[string]*zygoteSlot{}}

type zygoteSet struct {
	mu    sync.Mutex
	slots map[string]*zygoteSlot
}

// zygoteSlot is one start of a zygote.
type zygoteSlot struct {
	ready chan struct{} // closed once the start ended; then:
	z     *zygote       // nil when it failed
	err   error
	ended time.Time
}

// get returns the running zygote of plan, starting one when there is none
// or it died, and waiting (within ctx) while one starts. It fails without
// waiting while a failed start is younger than zygoteRetryAfter.
func (zs *zygoteSet) get(ctx context.Context, plan zygotePlan, log *slog.Logger) (*zygote, error) {
	for {
		zs.mu.Lock()
		s := zs.slots[plan.key]
		if s == nil {
			s = &zygoteSlot{ready: make(chan struct{})}
			zs.slots[plan.key] = s
			go s.start(plan, log)
		}
		zs.mu.Unlock()
		select {
		case <-s.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		switch {
		case s.z != nil && s.z.alive():
			return s.z, nil
		case s.z == nil && time.Since(s.ended) < zygoteRetryAfter:
			return nil, s.err
		}
		zs.mu.Lock()
		if zs.slots[plan.key] == s {
			delete(zs.slots, plan.key)
		}
		zs.mu.Unlock()
	}
}

func (s *zygoteSlot) start(plan zygotePlan, log *slog.Logger) {
	s.z, s.err = startZygote(plan)
	if s.err != nil {
		log.Warn("python kernels are started without a zygote for a while", "python", plan.python, "preload", plan.preload, "err", s.err)
	}
	s.ended = time.Now()
	close(s.ready)
}

// StopZygotes ends every zygote of this process (they are started again
// when needed). Kernels forked from them keep running.
func StopZygotes() {
	zygotes.mu.Lock()
	slots := zygotes.slots
	zygotes.slots = map[string]*zygoteSlot{}
	zygotes.mu.Unlock()
	for _, s := range slots {
		<-s.ready
		if s.z != nil {
			s.z.stop()
		}
	}
}

// zygotePIDs lists the pids of the running zygotes (for tests).
func zygotePIDs() []int {
	zygotes.mu.Lock()
	defer zygotes.mu.Unlock()
	var out []int
	for _, s := range zygotes.slots {
		select {
		case <-s.ready:
			if s.z != nil {
				out = append(out, s.z.pid)
			}
		default:
		}
	}
	return out
}

// zygote is one running zygote process, a child of the gateway.
type zygote struct {
	pid  int
	dir  string // its private directory: socket, log, HOME
	sock string

	mu      sync.Mutex
	reaped  bool
	spare   *spareChild // forked ahead of need, or nil
	filling bool        // a refill runs
	fills   sync.WaitGroup
}

var staleZygoteDirs sync.Once

// startZygote starts the zygote of plan and waits until it has imported
// everything and listens.
func startZygote(plan zygotePlan) (*zygote, error) {
	root := DefaultRuntimeDir()
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	staleZygoteDirs.Do(func() { removeStaleZygoteDirs(root) })
	dir, err := os.MkdirTemp(root, "zygote-"+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return nil, err
	}
	z := &zygote{dir: dir, sock: filepath.Join(dir, "s")}
	fail := func(err error) (*zygote, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	kd, err := newKernelDirs(filepath.Join(dir, "z"))
	if err != nil {
		return fail(err)
	}
	if err := copySeed(plan.homeSeed, kd.Home); err != nil {
		return fail(err)
	}
	env := CleanEnv(kd)
	for k, v := range plan.env {
		env[k] = v
	}
	spec := &kernelspecs.Spec{Env: plan.env}
	_, specEnv := spec.Command("", func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	for k, v := range specEnv {
		env[k] = v
	}
	config, _ := json.Marshal(map[string]any{"module": plan.module, "preload": plan.preload, "socket": z.sock})
	logFile, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		return fail(err)
	}
	defer logFile.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	defer readyR.Close()
	cmd := exec.Command(plan.python, "-c", zygoteSource, zygoteMarker, string(config))
	cmd.Env = envList(env)
	cmd.Dir = kd.Work
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.ExtraFiles = []*os.File{readyW} // fd 3
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = startOnParentThread(cmd)
	readyW.Close()
	if err != nil {
		return fail(err)
	}
	// The gateway reaps the zygote itself (alive, stop): no goroutine and
	// no descriptor is kept for an idle zygote.
	z.pid = cmd.Process.Pid
	cmd.Process.Release()
	readyR.SetReadDeadline(time.Now().Add(zygoteStartWait))
	line, err := bufio.NewReader(readyR).ReadString('\n')
	if line == "ready\n" {
		z.refill()
		return z, nil
	}
	z.stop()
	log, _ := os.ReadFile(filepath.Join(dir, "log"))
	switch {
	case strings.HasPrefix(line, "error "):
		return nil, fmt.Errorf("zygote: %s", strings.TrimSpace(strings.TrimPrefix(line, "error ")))
	case err != nil:
		return nil, fmt.Errorf("zygote did not start: %v%s", err, outputSuffix(tailOf(string(log), 2048)))
	}
	return nil, fmt.Errorf("zygote said %q", line)
}

// A parent-death signal is sent when the thread that forked the process
// exits, not the process (go.dev/issue/27505): Go ends an OS thread whose
// goroutine exits while locked to it, as the sandbox's network bridge
// does, and every kernel exec'd from that thread, or every zygote and
// through CLONE_PARENT every kernel forked from it, would die with it.
// So kernels and zygotes are started from one OS thread that never exits:
// the goroutine locked to it lives as long as the gateway process, which
// is its owner; it ends when the process does.
var (
	parentThread     sync.Once
	parentThreadJobs chan func()
)

// startOnParentThread starts cmd from the thread that never exits.
func startOnParentThread(cmd *exec.Cmd) error {
	parentThread.Do(func() {
		parentThreadJobs = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread stays this goroutine's
			for job := range parentThreadJobs {
				job()
			}
		}()
	})
	done := make(chan error, 1)
	parentThreadJobs <- func() { done <- cmd.Start() }
	return <-done
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// removeStaleZygoteDirs removes the directories of zygotes whose gateway
// is gone.
func removeStaleZygoteDirs(root string) {
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), "zygote-")
		if !ok || !e.IsDir() {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
}

// alive says whether the zygote still runs, reaping it if it ended.
func (z *zygote) alive() bool {
	z.mu.Lock()
	if z.reaped {
		z.mu.Unlock()
		return false
	}
	var ws unix.WaitStatus
	pid, err := unix.Wait4(z.pid, &ws, unix.WNOHANG, nil)
	if pid != z.pid && !errors.Is(err, unix.ECHILD) {
		z.mu.Unlock()
		return true
	}
	z.reaped = true
	spare := z.spare
	z.spare = nil
	z.mu.Unlock()
	z.cleanUp(spare)
	return false
}

// gone is called when the zygote stopped answering: it is killed and
// reaped, and the next launch starts another.
func (z *zygote) gone() { z.stop() }

// stop kills and reaps the zygote and its spare child and removes its
// directory.
func (z *zygote) stop() {
	z.mu.Lock()
	if z.reaped {
		z.mu.Unlock()
		return
	}
	z.reaped = true
	spare := z.spare
	z.spare = nil
	z.mu.Unlock()
	syscall.Kill(z.pid, syscall.SIGKILL)
	reap(z.pid)
	z.cleanUp(spare)
}

// cleanUp ends what a reaped zygote leaves: a refill in progress, its
// spare child, its directory.
func (z *zygote) cleanUp(spare *spareChild) {
	z.fills.Wait()
	spare.discard()
	os.RemoveAll(z.dir)
}

// reap waits for the child pid to end.
func reap(pid int) {
	var ws unix.WaitStatus
	for {
		if _, err := unix.Wait4(pid, &ws, 0, nil); !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// spareChild is a child the zygote forked ahead of need, parked before
// its request and already moved into a cgroup of its own (where the
// machine has cgroups): a launch that claims it skips the fork and the
// cgroup move (which waits for an RCU grace period, some 10 ms, in cgroup
// v1). Its cgroup has no limits until the launch sets them. While parked
// it runs no code but the zygote's and reads as a zygote in ps.
type spareChild struct {
	pid int
	cg  *kernelCgroup // nil without cgroups
}

// discard kills and reaps the spare child and removes its cgroup.
func (s *spareChild) discard() {
	if s == nil {
		return
	}
	syscall.Kill(s.pid, syscall.SIGKILL)
	reap(s.pid)
	s.cg.remove()
}

// takeSpare hands out the spare child, if any.
func (z *zygote) takeSpare() *spareChild {
	z.mu.Lock()
	defer z.mu.Unlock()
	s := z.spare
	z.spare = nil
	return s
}

// refill forks a new spare child in the background unless there is one.
func (z *zygote) refill() {
	z.mu.Lock()
	if z.reaped || z.spare != nil || z.filling {
		z.mu.Unlock()
		return
	}
	z.filling = true
	z.fills.Add(1)
	z.mu.Unlock()
	go func() {
		defer z.fills.Done()
		s, err := z.forkSpare()
		z.mu.Lock()
		z.filling = false
		keep := err == nil && !z.reaped
		if keep {
			z.spare = s
		}
		z.mu.Unlock()
		if err == nil && !keep {
			s.discard()
		}
	}()
}

// forkSpare asks the zygote for a spare child and moves it into a cgroup
// of its own.
func (z *zygote) forkSpare() (*spareChild, error) {
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: z.sock, Net: "unix"})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(zygoteForkWait))
	req := forkRequest{Kind: "spare", Parent: os.Getpid(), DieWithParent: true}
	var reply forkReply
	if err := writeZygoteFrame(conn, req, nil); err != nil {
		return nil, err
	}
	if err := readZygoteFrame(conn, &reply); err != nil {
		return nil, err
	}
	if reply.Error != "" || reply.Pid <= 0 {
		return nil, fmt.Errorf("zygote: %s", reply.Error)
	}
	s := &spareChild{pid: reply.Pid}
	if host, err := hostCgroups(); err == nil {
		if s.cg, err = host.createUnlimited(cgroupName("spare")); err == nil {
			err = s.cg.join(s.pid)
		}
		if err != nil {
			s.discard()
			return nil, err
		}
	}
	// Parked: the spare copies the pages a kernel writes, charged to its
	// own cgroup (zygote.py, copy_written_pages).
	if err := writeZygoteFrame(conn, map[string]bool{"parked": true}, nil); err != nil {
		s.discard()
		return nil, err
	}
	return s, nil
}

// createUnlimited makes the cgroup name, without limits, in every
// hierarchy that carries memory or pids.
func (h *cgroupHost) createUnlimited(name string) (*kernelCgroup, error) {
	cg := &kernelCgroup{}
	for _, hi := range h.hierarchies {
		if !hi.has("memory") && !hi.has("pids") {
			continue
		}
		leaf := cgLeaf{cgHierarchy: hi, dir: filepath.Join(hi.parent, name)}
		if err := os.Mkdir(leaf.dir, 0o755); err != nil {
			cg.remove()
			return nil, err
		}
		cg.leaves = append(cg.leaves, leaf)
	}
	return cg, nil
}

// applyLimits sets the limits of l on a cgroup made by createUnlimited.
func (cg *kernelCgroup) applyLimits(l Limits) error {
	for _, leaf := range cg.snapshot() {
		if err := leaf.setLimits(leaf.has("memory") && l.MemoryBytes > 0, leaf.has("pids"), l); err != nil {
			return err
		}
	}
	return nil
}

// forkRequest is what a zygote gets for one kernel.
type forkRequest struct {
	Kind          string            `json:"kind"` // fork (default), spare or claim
	Pid           int               `json:"pid,omitempty"`
	Argv          []string          `json:"argv"`
	Env           map[string]string `json:"env"`
	Cwd           string            `json:"cwd"`
	Parent        int               `json:"parent"`
	DieWithParent bool              `json:"die_with_parent"`
}

// forkReply is the zygote's answer, or a claimed spare child's.
type forkReply struct {
	Pid   int    `json:"pid"`
	Error string `json:"error"`
}

// fork asks the zygote for a kernel running argv with env in startDir,
// or, with spare, hands that to the spare child; then it gates the kernel
// into lp's cgroup (the spare's own, with lp's limits set) and limits. An
// error wrapping errZygoteGone means the zygote did not answer,
// errSpareGone that the spare did not; either way no child was made. A
// detached kernel outlives the gateway and writes its output into a file
// of its directory (localinfo.go).
func (z *zygote) fork(ctx context.Context, lp *localProcess, spare *spareChild, argv []string, env map[string]string, startDir string, limits Limits, detached bool) (*forkedProcess, error) {
	deadline := time.Now().Add(zygoteForkWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: z.sock, Net: "unix"})
	if err != nil {
		spare.discard()
		return nil, fmt.Errorf("%w: %v", errZygoteGone, err)
	}
	defer conn.Close()
	conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()

	// The kernel's stdout and stderr: the write end of a pipe that feeds
	// its output tail, or a detached kernel's output file.
	var outR, outW *os.File
	var outFile string
	if detached {
		outFile = filepath.Join(lp.dir, outputFileName)
		outW, err = os.OpenFile(outFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	} else {
		outR, outW, err = os.Pipe()
	}
	if err != nil {
		spare.discard()
		return nil, err
	}
	req := forkRequest{Kind: "fork", Argv: argv, Env: env, Cwd: startDir, Parent: os.Getpid(), DieWithParent: !detached}
	if spare != nil {
		req.Kind, req.Pid = "claim", spare.pid
	}
	err = writeZygoteFrame(conn, req, outW)
	outW.Close()
	var reply forkReply
	if err == nil {
		err = readZygoteFrame(conn, &reply)
	}
	if err == nil && (reply.Error != "" || reply.Pid <= 0) {
		err = fmt.Errorf("zygote refused the kernel: %s", reply.Error)
	} else if err == nil && spare != nil && reply.Pid != spare.pid {
		err = fmt.Errorf("spare %d answered as %d", spare.pid, reply.Pid)
	}
	if err != nil {
		closeFile(outR)
		switch {
		case spare != nil:
			spare.discard()
			return nil, fmt.Errorf("%w: %v", errSpareGone, err)
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case reply.Error != "":
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", errZygoteGone, err)
	}
	joined := false
	if spare != nil && spare.cg != nil {
		// The kernel's cgroup is the spare's, already joined.
		old := lp.cg
		lp.cg, joined = spare.cg, true
		old.remove()
		if err := lp.cg.applyLimits(limits); err != nil {
			syscall.Kill(reply.Pid, syscall.SIGKILL)
			reap(reply.Pid)
			closeFile(outR)
			return nil, fmt.Errorf("cgroup: %w", err)
		}
	}
	// The child is the gateway's: its pid stays ours until we reap it.
	proc, err := os.FindProcess(reply.Pid)
	if err != nil {
		syscall.Kill(reply.Pid, syscall.SIGKILL)
		reap(reply.Pid)
		closeFile(outR)
		return nil, err
	}
	fp := &forkedProcess{
		ci: lp.ci, dir: lp.dir, tail: lp.tail, cg: lp.cg,
		pid: reply.Pid, proc: proc, out: outR, outFile: outFile, detached: detached,
		copied: make(chan struct{}), done: make(chan struct{}),
	}
	if outR != nil {
		go fp.copyOutput()
	} else {
		close(fp.copied)
	}
	go fp.wait()
	if err := fp.setup(conn, limits, joined); err != nil {
		syscall.Kill(-fp.pid, syscall.SIGKILL)
		syscall.Kill(fp.pid, syscall.SIGKILL) // before its setsid
		<-fp.done
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("%v%s", err, outputSuffix(fp.Output()))
	}
	return fp, nil
}

// setup runs while the child waits at its gate: it joins the cgroup, sets
// the rlimits, opens the gate and waits for the child's word.
func (fp *forkedProcess) setup(conn *net.UnixConn, limits Limits, joined bool) error {
	if fp.cg != nil && !joined {
		if err := fp.cg.join(fp.pid); err != nil {
			return fmt.Errorf("cgroup: %w", err)
		}
	}
	if err := limits.setRlimits(fp.pid); err != nil {
		return err
	}
	if err := writeZygoteFrame(conn, map[string]bool{"go": true}, nil); err != nil {
		return fmt.Errorf("opening the gate: %w", err)
	}
	var ok struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
	}
	if err := readZygoteFrame(conn, &ok); err != nil {
		return fmt.Errorf("forked kernel did not start: %w", err)
	}
	if !ok.OK {
		return fmt.Errorf("forked kernel did not start: %s", ok.Error)
	}
	return nil
}

// writeZygoteFrame writes v as a frame, passing fd along with its length.
func writeZygoteFrame(conn *net.UnixConn, v any, fd *os.File) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	head := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	if fd != nil {
		if _, _, err := conn.WriteMsgUnix(head, unix.UnixRights(int(fd.Fd())), nil); err != nil {
			return err
		}
	} else if _, err := conn.Write(head); err != nil {
		return err
	}
	_, err = conn.Write(body)
	return err
}

func readZygoteFrame(conn *net.UnixConn, v any) error {
	var head [4]byte
	if _, err := io.ReadFull(conn, head[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n > maxZygoteFrame {
		return fmt.Errorf("frame of %d bytes", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(conn, body); err != nil {
		return err
	}
	return json.Unmarshal(body, v)
}

// forkedProcess is a kernel forked from a zygote: a child of the gateway
// like a localProcess, watched through the pidfd of its os.Process.
type forkedProcess struct {
	ci   jupyter.ConnInfo
	dir  string
	pid  int
	proc *os.Process
	tail *tailbuf.Buffer
	out  *os.File // read end of the kernel's stdout and stderr; nil when detached
	cg   *kernelCgroup

	// set for a detached kernel (localinfo.go)
	detached bool
	outFile  string // its stdout and stderr
	guard    *orphanGuard

	plan *commandPlan // how to start commands beside it (command.go)

	copied chan struct{} // closed when out is drained
	done   chan struct{}
	status string // set before done is closed
	reason string // set before done is closed
}

var (
	_ jupyter.Process     = (*forkedProcess)(nil)
	_ jupyter.InfoProcess = (*forkedProcess)(nil)
	_ jupyter.Releaser    = (*forkedProcess)(nil)
)

func (fp *forkedProcess) ConnInfo() jupyter.ConnInfo { return fp.ci }
func (fp *forkedProcess) PID() int                   { return fp.pid }
func (fp *forkedProcess) Done() <-chan struct{}      { return fp.done }
func (fp *forkedProcess) Output() string {
	if fp.outFile != "" {
		return fileTail(fp.outFile, outputTailDefault)
	}
	return fp.tail.String()
}

func (fp *forkedProcess) ExitStatus() string {
	select {
	case <-fp.done:
		return fp.status
	default:
		return ""
	}
}

func (fp *forkedProcess) ExitReason() string {
	select {
	case <-fp.done:
		return fp.reason
	default:
		return ""
	}
}

// copyOutput feeds the output tail until every writer closed the pipe or
// wait gave up on them.
func (fp *forkedProcess) copyOutput() {
	io.Copy(fp.tail, fp.out)
	fp.out.Close()
	close(fp.copied)
}

// wait is the one goroutine that reaps the kernel.
func (fp *forkedProcess) wait() {
	ps, err := fp.proc.Wait()
	switch {
	case err != nil:
		fp.status = err.Error()
	case ps.Success():
		fp.status = "exit status 0"
	default:
		fp.status = ps.String()
	}
	if fp.cg != nil && killedBySignal(ps) && fp.cg.oomKills() > 0 {
		fp.reason = ReasonOutOfMemory
	}
	// Whatever the kernel left in its group (or its cgroup) goes with it.
	syscall.Kill(-fp.pid, syscall.SIGKILL)
	fp.cg.kill()
	// As exec.Cmd.WaitDelay: a kernel's children may hold the pipe open.
	select {
	case <-fp.copied:
	case <-time.After(time.Second):
		fp.out.SetReadDeadline(time.Now())
		<-fp.copied
	}
	close(fp.done)
}

// Interrupt, Terminate and Kill send SIGINT, SIGTERM and SIGKILL to the
// kernel's process group.
func (fp *forkedProcess) Interrupt() error { return fp.Signal(syscall.SIGINT) }
func (fp *forkedProcess) Terminate() error { return fp.Signal(syscall.SIGTERM) }
func (fp *forkedProcess) Kill() error      { return fp.Signal(syscall.SIGKILL) }

// Signal signals the kernel's process group.
func (fp *forkedProcess) Signal(sig syscall.Signal) error {
	select {
	case <-fp.done:
		return os.ErrProcessDone
	default:
	}
	return syscall.Kill(-fp.pid, sig)
}

// ProvisionerInfo says how to find and control the kernel again.
func (fp *forkedProcess) ProvisionerInfo() (jupyter.ProvisionerInfo, error) {
	li := &Info{RuntimeDir: fp.dir, OutputFile: fp.outFile, Detached: fp.detached, Command: fp.plan.info()}
	return localInfo(fp.ci, fp.pid, fp.done, fp.guard, fp.cg, li)
}

// Release stops renewing the kernel's lease, as localProcess's.
func (fp *forkedProcess) Release() { fp.guard.release() }

func (fp *forkedProcess) Cleanup() error {
	fp.guard.end()
	return errors.Join(fp.cg.remove(), os.RemoveAll(fp.dir))
}

// closeFile closes f unless it is nil.
func closeFile(f *os.File) {
	if f != nil {
		f.Close()
	}
}

package gateway

// The checklist, 21-25: resources and isolation of kernels (helpers in checklist_helpers_test.go).

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kernelgate/internal/leakcheck"
	"kernelgate/provision/local"
	"kernelgate/runs"
	"kernelgate/sessions"
)

// b4ForkBomb starts processes until the system refuses one, then kills
// and reaps them and re-raises the failure. It spawns sleep (vfork and
// exec) rather than forking Python, so the processes hit the pids limit
// long before their copied memory would hit the memory limit.
const b4ForkBomb = `
import subprocess
procs = []
try:
    for i in range(500):
        procs.append(subprocess.Popen(['sleep', '30']))
finally:
    for p in procs:
        p.kill()
        p.wait()
`

// B4 #21: "Code: fork bomb, 10 GB allocation, fill /tmp, CPU spin, 1e7
// threads/fds" → "kernel hits pids/memory/disk/cpu limits → error or kernel
// death reported; gateway and other kernels unaffected".
//
// provision/local's TestMemoryLimitKillsKernel, TestPidsLimitStopsForkBomb and
// TestRlimits cover the limits on one kernel. Here, through /api/execute:
// a 1 GiB allocation in a context limited to 256 MiB ends its run "lost"
// while a run on another context completes and the gateway's memory stays
// flat; a fork bomb fails with BlockingIOError under the pids limit; too
// many files fail with EMFILE under RLIMIT_NOFILE; in the sandbox, filling
// /tmp (a tmpfs charged to the kernel's memory) kills only that kernel.
// CPU is not limited (no cpu controller is used) and disk writes outside
// the sandbox's /tmp are not bounded: see docs/security.md.
func TestB4_21_ResourceLimits(t *testing.T) {
	limits := local.Limits{MemoryBytes: 256 << 20, Pids: 64, NoFile: 256}
	g := newGateway(t, func(m *sessions.Config, _ *Config) { m.KernelLimits = limits })
	hog := b4Context(t, g, map[string]any{"id": "hog"})
	b4NeedCgroup(t, *hog.KernelProcessID)
	b4Context(t, g, map[string]any{"id": "calm"})
	g.run(map[string]any{"code": "kept = 'calm'", "context": "calm"})

	runtime.GC()
	before := rssBytes(t)
	resp := startStream(t, g, map[string]any{"code": "import time\ntime.sleep(0.5)\nx = bytearray(1 << 30)", "context": "hog"})
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	first := readEvents(t, sc, func(e event) bool { return e.Type == "start" })
	eventually(t, 10*time.Second, func() bool {
		return decode[runs.RunModel](t, mustGet(t, g, "/api/runs/"+first[0].Run)).State != runs.RunQueued
	})
	// A run queued behind the allocation is the next run after the death:
	// it must start a fresh kernel ("lost ... the next run starts a kernel
	// without the earlier state").
	queued := make(chan runs.Execution, 1)
	go func() {
		var e runs.Execution
		defer func() { queued <- e }()
		req, _ := http.NewRequest("POST", g.url+"/api/execute", strings.NewReader(`{"code":"6*7","context":"hog"}`))
		req.Header.Set("Authorization", "token "+testToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("queued run: %v", err)
			return
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("queued run: %d %v", resp.StatusCode, err)
		}
	}()
	if e := g.run(map[string]any{"code": "sum(range(10**6)), kept", "context": "calm"}); b4Result(e) != "(499999500000, 'calm')" {
		t.Errorf("run on another context during the allocation: %+v", e)
	}
	evs := readEvents(t, sc, func(e event) bool { return e.Type == "end" })
	if end := evs[len(evs)-1]; end.Type != "end" || end.Process.Reason != runs.Lost || end.Process.ExitCode != nil || !strings.Contains(end.Process.Message, "out of memory") {
		t.Errorf("1 GiB in 256 MiB: %s, want lost, out of memory", end.Raw)
	}
	if grew := rssBytes(t) - before; grew > 64<<20 {
		t.Errorf("gateway RSS grew by %d MiB", grew>>20)
	}
	if e := g.run(map[string]any{"code": "kept", "context": "calm"}); b4Result(e) != "'calm'" {
		t.Errorf("the other context after the OOM: %+v", e)
	}
	if next := <-queued; next.Process.Reason != runs.Completed || b4Result(next) != "42" {
		t.Errorf("the run queued behind the one that killed the kernel: %s, want completed on a fresh kernel (runs sent before the gateway has cleaned up the dead process end lost without running)", next.Process.Reason)
		eventually(t, 15*time.Second, func() bool {
			return !decode[sessions.ContextModel](t, mustGet(t, g, "/api/contexts/hog")).Active
		})
	}

	e := g.run(map[string]any{"code": b4ForkBomb, "context": "hog"})
	if e.Error == nil || e.Error.Name != "BlockingIOError" || e.Process.Reason != runs.Errored {
		t.Errorf("fork bomb under pids 64: %+v, want BlockingIOError", e)
	}
	e = g.run(map[string]any{"code": "fds = []\ntry:\n    while len(fds) < 100000:\n        fds.append(open('/dev/null'))\nfinally:\n    n = len(fds)\n    [f.close() for f in fds]", "context": "hog"})
	if e.Error == nil || !strings.Contains(e.Error.Value, "Too many open files") {
		t.Errorf("100 000 files under nofile 256: %+v, want EMFILE", e.Error)
	}
	if e := g.run(map[string]any{"code": "n < 256, 6*7", "context": "hog"}); b4Result(e) != "(True, 42)" {
		t.Errorf("kernel after fork bomb and files: %+v", e)
	}

	t.Run("fill /tmp in the sandbox", func(t *testing.T) {
		b4NeedSandbox(t)
		g := newGateway(t, b4Sandboxed(local.SandboxConfig{}), func(m *sessions.Config, _ *Config) { m.KernelLimits = limits })
		b4Context(t, g, map[string]any{"id": "filler"})
		b4Context(t, g, map[string]any{"id": "bystander"})
		e := g.run(map[string]any{"code": "import os\nwith open('/tmp/fill', 'wb') as f:\n    for i in range(1024):\n        f.write(b'x' * (1 << 20))", "context": "filler"})
		if e.Process.Reason != runs.Lost && (e.Error == nil || !strings.Contains(e.Error.Value, "No space")) {
			t.Errorf("1 GiB into the sandbox's /tmp under 256 MiB: %+v %+v, want lost (OOM) or ENOSPC", e.Process, e.Error)
		}
		t.Logf("filling /tmp: run ended %s", e.Process.Reason)
		if e := g.run(map[string]any{"code": "6*7", "context": "bystander"}); b4Result(e) != "42" {
			t.Errorf("other kernel: %+v", e)
		}
	})
}

// B4 #22: "1 000 parallel POST /api/kernels" → "capped at limit (403/429),
// pending counted, no orphan processes/pods".
//
// TestMaxKernelsUnderConcurrentStarts covers 20 starts. Here 100 (CI time)
// against MaxKernels 3, with a pids limit as by default (so each kernel has
// a cgroup), one kernel leaving a child in a session of its own (out of
// its process group); after the kernels are deleted no process of theirs
// is left. Then the same escape from a kernel without cgroup limits.
func TestB4_22_ParallelStartsNoOrphans(t *testing.T) {
	const max, n = 3, 100
	childrenBefore := len(leakcheck.Children())
	g := newGateway(t, func(m *sessions.Config, _ *Config) {
		m.MaxKernels = max
		m.KernelLimits = local.Limits{Pids: 256}
	})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	var ids []string
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, body, err := g.send("POST", "/api/kernels", map[string]string{"name": "python3"}, g.auth())
			if err != nil {
				t.Errorf("POST /api/kernels: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			codes[status]++
			if status == http.StatusCreated {
				var k sessions.KernelModel
				json.Unmarshal(body, &k)
				ids = append(ids, k.ID)
			}
		}()
	}
	wg.Wait()
	if codes[http.StatusCreated] != max || codes[http.StatusTooManyRequests] != n-max {
		t.Fatalf("status counts %v, want %d×201 and %d×429", codes, max, n-max)
	}
	kk, _ := g.mgr.Kernel(ids[0])
	b4NeedCgroup(t, kk.PID())
	connFile, _ := b4ConnFile(t, kk.PID())
	runtimeDir := filepath.Dir(filepath.Dir(filepath.Dir(connFile)))
	escaped := b4Escape(t, g.mustDial(ids[0], true))
	if len(b4Procs(runtimeDir)) < max+1 {
		t.Fatalf("kernel processes not found under %s", runtimeDir)
	}
	for _, id := range ids {
		if status, _ := g.do("DELETE", "/api/kernels/"+id, nil); status != http.StatusNoContent {
			t.Errorf("DELETE %s: %d", id, status)
		}
	}
	if left := b4Leftovers(runtimeDir, 10*time.Second); len(left) > 0 {
		t.Errorf("processes left after deleting every kernel: %v (the escaped child is %d)", left, escaped)
	}
	eventually(t, 10*time.Second, func() bool { return len(leakcheck.Children()) <= childrenBefore })
	if n := len(g.mgr.Kernels()); n != 0 {
		t.Errorf("%d kernels left", n)
	}

	t.Run("without cgroup limits", func(t *testing.T) {
		g := newGateway(t)
		k := g.startKernel("python3")
		kk, _ := g.mgr.Kernel(k.ID)
		connFile, _ := b4ConnFile(t, kk.PID())
		runtimeDir := filepath.Dir(filepath.Dir(filepath.Dir(connFile)))
		escaped := b4Escape(t, g.mustDial(k.ID, true))
		if status, _ := g.do("DELETE", "/api/kernels/"+k.ID, nil); status != http.StatusNoContent {
			t.Fatalf("DELETE: %d", status)
		}
		if left := b4Leftovers(runtimeDir, 5*time.Second); len(left) > 0 {
			t.Errorf("a child that left the kernel's process group survives the kernel's deletion: %v (escaped %d); without a cgroup only the process group is killed", left, escaped)
		}
	})
}

// b4Connect is Python code that tries to open TCP connections with a 2 s
// timeout and prints, as JSON, how each attempt ended and how long it took.
const b4Connect = `
import json, socket, time
out = {}
for name, host, port in TARGETS:
    t0 = time.time()
    try:
        socket.create_connection((host, port), timeout=2).close()
        r = 'connected'
    except OSError as e:
        r = type(e).__name__ + ':' + str(e.errno)
    out[name] = [r, round(time.time() - t0, 3)]
print(json.dumps(out))
`

// B4 #23: "Kernel egress to 169.254.169.254, kube-apiserver, gateway admin
// port, other kernels' ZMQ ports" → "blocked (netns/NetworkPolicy)".
//
// With the sandbox and its network off, a kernel has only its own
// loopback: the gateway's port, another kernel's ports, the host's
// addresses and the metadata address all fail at once (refused or
// unreachable, never a hang). provision/local's TestSandboxedPython/Deno "no
// network" cover a host loopback port. Without the sandbox, or with
// --sandbox-network, nothing is blocked (docs/security.md).
func TestB4_23_Egress(t *testing.T) {
	b4NeedSandbox(t)
	g := newGateway(t, b4Sandboxed(local.SandboxConfig{}))
	a := b4Context(t, g, map[string]any{"id": "a"})
	b := b4Context(t, g, map[string]any{"id": "b"})
	_, ciB := b4ConnFile(t, *b.KernelProcessID)
	gw, _ := strconv.Atoi(b4Port(g))
	targets := [][3]any{
		{"gateway", "127.0.0.1", gw},
		{"kernel b shell", "127.0.0.1", ciB.ShellPort},
		{"kernel b control", "127.0.0.1", ciB.ControlPort},
		{"metadata", "169.254.169.254", 80},
		{"kube-apiserver", "10.96.0.1", 443},
		{"public", "1.1.1.1", 443},
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, ad := range addrs {
			if ip, ok := ad.(*net.IPNet); ok && ip.IP.To4() != nil && !ip.IP.IsLoopback() {
				targets = append(targets, [3]any{"host " + ip.IP.String(), ip.IP.String(), gw})
				break
			}
		}
	}
	js, _ := json.Marshal(targets)
	var got map[string][2]any
	b4JSON(t, g, "a", "TARGETS = "+string(js)+"\n"+b4Connect, &got)
	for name, r := range got {
		outcome, _ := r[0].(string)
		took, _ := r[1].(float64)
		if outcome == "connected" {
			t.Errorf("sandboxed kernel connected to %s", name)
		}
		if strings.HasPrefix(outcome, "timeout") || strings.HasPrefix(outcome, "TimeoutError") || took > 1.5 {
			t.Errorf("%s: %s after %.2fs, want a fast failure", name, outcome, took)
		}
	}
	t.Logf("from sandboxed kernel %s: %v", *a.KernelID, got)
}

// B4 #24: "Kernel A reads kernel B's connection file or sends
// unsigned/forged messages to B's ports" → "permission denied; B rejects
// bad signatures".
//
// Sandboxed, the runtime directory is hidden, so A cannot open B's
// connection file. To test the signature check alone, the sandbox's network
// is on here (A can reach B's ports): A sends B execute_requests with no
// signature and with a signature of a wrong key (B ignores both), then one
// signed with B's real key, which the test reads on the host (B runs it:
// the channel works, only the signature stood in the way).
func TestB4_24_CrossKernelZMQ(t *testing.T) {
	b4NeedSandbox(t)
	g := newGateway(t, b4Sandboxed(local.SandboxConfig{Network: true}))
	b4Context(t, g, map[string]any{"id": "a"})
	b := b4Context(t, g, map[string]any{"id": "b"})
	g.run(map[string]any{"code": "state = 'b'", "context": "b"})
	pathB, ciB := b4ConnFile(t, *b.KernelProcessID)
	code := fmt.Sprintf(`
import hashlib, hmac, json, os, uuid, datetime
PATH, PORT, KEY = %q, %d, %q
out = {}
try:
    open(PATH).read()
    out['read'] = 'read'
except OSError as e:
    out['read'] = type(e).__name__
import zmq
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0)
s.connect('tcp://127.0.0.1:%%d' %% PORT)
def send(code, key):
    header = json.dumps({'msg_id': str(uuid.uuid4()), 'msg_type': 'execute_request', 'session': 'forger',
                         'username': 'forger', 'date': datetime.datetime.utcnow().isoformat() + 'Z', 'version': '5.3'}).encode()
    parts = [header, b'{}', b'{}', json.dumps({'code': code, 'silent': False, 'store_history': False,
             'user_expressions': {}, 'allow_stdin': False, 'stop_on_error': False}).encode()]
    sig = hmac.new(key.encode(), b''.join(parts), hashlib.sha256).hexdigest().encode() if key else b''
    s.send_multipart([b'<IDS|MSG>', sig] + parts)
send("unsigned = 1", None)
send("wrong_key = 1", "not-the-key")
send("signed = 1", KEY)
out['reply'] = bool(s.poll(10000))
print(json.dumps(out))
`, pathB, ciB.ShellPort, ciB.Key)
	var got struct {
		Read  string `json:"read"`
		Reply bool   `json:"reply"`
	}
	b4JSON(t, g, "a", code, &got)
	if got.Read == "read" {
		t.Errorf("kernel a read kernel b's connection file %s", pathB)
	}
	if !got.Reply {
		t.Fatalf("the correctly signed request got no reply: the test did not reach kernel b")
	}
	if e := g.run(map[string]any{"code": "sorted(n for n in ('unsigned', 'wrong_key', 'signed') if n in globals()), state", "context": "b"}); b4Result(e) != "(['signed'], 'b')" {
		t.Errorf("kernel b after forged messages: %s, want (['signed'], 'b')", b4Result(e))
	}
}

// B4 #25: "Kernel reads gateway config/token files or writes into another
// kernel's cwd" → "denied (uid + mount ns)".
//
// The sandbox binds / read-only: what hides a file is its place (/tmp,
// /var/tmp and the runtime directory are always hidden) or SandboxConfig.Hide.
// A root gateway runs kernels as the sandbox user (nobody), so a root-owned
// 0600 file outside those places is closed to them too. Writes into another
// context's working directory never reach it:
// the host is read-only and the other directory is not bound writable.
// provision/local's TestSandboxedPython covers hidden paths and read-only writes.
func TestB4_25_GatewayFilesAndOtherCwd(t *testing.T) {
	b4NeedSandbox(t)
	conf := b4HostDir(t)
	hidden := filepath.Join(conf, "hidden")
	os.Mkdir(hidden, 0o700)
	const secret = "kg-b4-key-secret-0123456789"
	os.WriteFile(filepath.Join(hidden, "api-keys"), []byte("agent exec "+secret+"\n"), 0o600)
	os.WriteFile(filepath.Join(conf, "unlisted-keys"), []byte("agent exec "+secret+"\n"), 0o600)
	// Each context gets a workspace of its own below the root, given to
	// the sandbox user (nobody).
	root := b4HostDir(t)
	g := newGateway(t, b4Sandboxed(local.SandboxConfig{Hide: []string{hidden}}), func(m *sessions.Config, _ *Config) { m.Workspaces = mustRoot(t, root) })
	ws := filepath.Join(root, "contexts")
	b4Context(t, g, map[string]any{"id": "a"})
	b4Context(t, g, map[string]any{"id": "b"})
	g.run(map[string]any{"code": "open('mine.txt', 'w').write('b')", "context": "b"})

	code := fmt.Sprintf(`
import json, os
HIDDEN, UNLISTED, OTHER = %q, %q, %q
def read(p):
    try:
        return open(p).read()
    except OSError as e:
        return type(e).__name__
def write(p):
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, 'w') as f:
            f.write('from a')
        return 'written'
    except OSError as e:
        return type(e).__name__
print(json.dumps({
    'hidden': read(HIDDEN), 'hidden_dir': os.listdir(os.path.dirname(HIDDEN)) if os.path.isdir(os.path.dirname(HIDDEN)) else None,
    'unlisted': read(UNLISTED),
    'other_read': read(os.path.join(OTHER, 'mine.txt')),
    'other_write': write(os.path.join(OTHER, 'from-a.txt')),
    'root_write': write(os.path.join(os.path.dirname(OTHER), 'from-a.txt')),
}))
`, filepath.Join(hidden, "api-keys"), filepath.Join(conf, "unlisted-keys"), filepath.Join(ws, "b"))
	var got map[string]any
	b4JSON(t, g, "a", code, &got)
	if s, _ := got["hidden"].(string); strings.Contains(s, secret) {
		t.Errorf("sandboxed kernel read a hidden keys file")
	}
	for _, p := range []string{filepath.Join(ws, "b", "from-a.txt"), filepath.Join(ws, "from-a.txt")} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("kernel a wrote %s on the host", p)
		}
	}
	if e := g.run(map[string]any{"code": "import os; sorted(f for f in os.listdir('.') if not f.startswith('.'))", "context": "b"}); b4Result(e) != "['mine.txt']" {
		t.Errorf("b's working directory: %s", b4Result(e))
	}
	// A root gateway runs sandboxed kernels as another user (nobody): a
	// root-owned 0600 file is closed to them wherever it is.
	if s, _ := got["unlisted"].(string); os.Geteuid() == 0 && strings.Contains(s, secret) {
		t.Errorf("a sandboxed kernel read a root-owned 0600 file outside the hidden paths (%s)", filepath.Join(conf, "unlisted-keys"))
	}
}

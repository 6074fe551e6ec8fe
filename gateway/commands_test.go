//go:build linux

package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kernelgate/provision/local"
	"kernelgate/runs"
	"kernelgate/sessions"
	"kernelgate/state"
)

// command runs a command in a context and returns its Execution.
func (g *testGateway) command(ctx string, body map[string]any) runs.Execution {
	g.t.Helper()
	status, out := g.do("POST", "/api/contexts/"+ctx+"/commands", body)
	if status != http.StatusOK {
		g.t.Fatalf("POST /api/contexts/%s/commands %v: %d %s", ctx, body, status, out)
	}
	return decode[runs.Execution](g.t, out)
}

// background starts a command in the background and returns its run id.
func (g *testGateway) background(ctx string, body map[string]any) string {
	g.t.Helper()
	body["background"] = true
	status, out := g.do("POST", "/api/contexts/"+ctx+"/commands", body)
	if status != http.StatusAccepted {
		g.t.Fatalf("POST /api/contexts/%s/commands %v: %d %s", ctx, body, status, out)
	}
	return decode[map[string]string](g.t, out)["run"]
}

// runModel reads GET /api/runs/{id}.
func (g *testGateway) runModel(id string) (state string, e runs.Execution) {
	g.t.Helper()
	status, out := g.do("GET", "/api/runs/"+id, nil)
	if status != http.StatusOK {
		g.t.Fatalf("GET /api/runs/%s: %d %s", id, status, out)
	}
	var m struct {
		State     string         `json:"state"`
		Execution runs.Execution `json:"execution"`
	}
	decodeInto(g.t, out, &m)
	return m.State, m.Execution
}

// waitRun waits for a run to end and returns its Execution.
func (g *testGateway) waitRun(id string, d time.Duration) runs.Execution {
	g.t.Helper()
	var e runs.Execution
	checkFor(g.t, d, "run "+id+" to end", func() bool {
		var state string
		state, e = g.runModel(id)
		return state == "done"
	})
	return e
}

// waitStdout waits until a running run's stdout holds want.
func (g *testGateway) waitStdout(id, want string, d time.Duration) {
	g.t.Helper()
	checkFor(g.t, d, "stdout of "+id+" to hold "+want, func() bool {
		_, e := g.runModel(id)
		return strings.Contains(strings.Join(e.Logs.Stdout, ""), want)
	})
}

func process(e runs.Execution) string {
	return string(e.Process.Reason) + "/" + exitCode(e)
}

func stderrOf(e runs.Execution) string { return strings.Join(e.Logs.Stderr, "") }

// TestCommandBasics: a shell string and an argv, exit codes, stdout and
// stderr apart, the context's env and folder shared with its kernel, a
// missing program and bad bodies.
func TestCommandBasics(t *testing.T) {
	g := newGateway(t)
	ctx := b4Context(t, g, map[string]any{"id": "c1", "env": map[string]string{"MY_SETTING": "v1"}})

	e := g.command("c1", map[string]any{"cmd": "echo out; echo err >&2; exit 3"})
	if b4Stdout(e) != "out\n" || stderrOf(e) != "err\n" || process(e) != "completed/3" {
		t.Errorf("shell command: stdout %q stderr %q process %s", b4Stdout(e), stderrOf(e), process(e))
	}
	if e.Context != "c1" || e.ID == "" || e.Truncated {
		t.Errorf("execution %+v", e)
	}
	// A list is the argv: no shell sees $HOME or the quote.
	e = g.command("c1", map[string]any{"cmd": []string{"printf", "%s|", "a b", "$HOME", "'"}})
	if b4Stdout(e) != "a b|$HOME|'|" || process(e) != "completed/0" {
		t.Errorf("argv command: stdout %q process %s", b4Stdout(e), process(e))
	}
	// The context's env and folder: a file a command writes is read by code.
	e = g.command("c1", map[string]any{"cmd": "echo $MY_SETTING > from-cmd.txt; pwd; echo $EXTRA", "env": map[string]string{"EXTRA": "x2"}})
	if got := strings.Fields(b4Stdout(e)); len(got) != 2 || got[0] != ctx.Cwd || got[1] != "x2" {
		t.Errorf("command's cwd and env: %q, context cwd %s", b4Stdout(e), ctx.Cwd)
	}
	if r := b4Result(g.run(map[string]any{"context": "c1", "code": "open('from-cmd.txt').read()"})); r != `'v1\n'` {
		t.Errorf("code read the command's file as %s", r)
	}
	g.run(map[string]any{"context": "c1", "code": "import os; os.makedirs('sub', exist_ok=True); open('sub/from-code.txt', 'w').write('hi from code')"})
	if e = g.command("c1", map[string]any{"cmd": []string{"cat", "from-code.txt"}, "cwd": "sub"}); b4Stdout(e) != "hi from code" {
		t.Errorf("command in sub read %q (%s %s)", b4Stdout(e), process(e), stderrOf(e))
	}
	// The run is a run: listed in the context, readable by id.
	status, out := g.do("GET", "/api/contexts/c1", nil)
	if m := decode[sessions.ContextModel](t, out); status != 200 || !contains(m.ProcessIDs, e.ID) {
		t.Errorf("processIds %v lack %s", m.ProcessIDs, e.ID)
	}
	if state, got := g.runModel(e.ID); state != "done" || b4Stdout(got) != "hi from code" {
		t.Errorf("GET /api/runs: %s %+v", state, got)
	}

	for _, tc := range []struct {
		body   any
		status int
		code   string
	}{
		{map[string]any{}, 400, "BAD_REQUEST"},
		{map[string]any{"cmd": ""}, 400, "BAD_REQUEST"},
		{map[string]any{"cmd": []string{}}, 400, "BAD_REQUEST"},
		{map[string]any{"cmd": 3}, 400, "BAD_REQUEST"},
		{map[string]any{"cmd": "true", "cwd": "../.."}, 400, "BAD_REQUEST"},
		{map[string]any{"cmd": "true", "cwd": "/etc"}, 400, "BAD_REQUEST"},
		{map[string]any{"cmd": []string{"no-such-program-kg"}}, 400, "BAD_REQUEST"},
		{map[string]any{"cmd": "true", "timeout": -1}, 400, "BAD_REQUEST"},
		{map[string]any{"cmd": "true", "stdin": true}, 400, "BAD_REQUEST"},
		{map[string]any{"cmd": "true", "shell": true}, 400, "BAD_REQUEST"},
	} {
		status, out := g.do("POST", "/api/contexts/c1/commands", tc.body)
		if status != tc.status || !strings.Contains(string(out), `"`+tc.code+`"`) {
			t.Errorf("%v: %d %s, want %d %s", tc.body, status, out, tc.status, tc.code)
		}
	}
	if status, out := g.do("POST", "/api/contexts/nope/commands", map[string]any{"cmd": "true"}); status != 404 || !strings.Contains(string(out), "SESSION_NOT_FOUND") {
		t.Errorf("unknown context: %d %s", status, out)
	}
	// The shared kernel's context takes commands too.
	if e := g.command("code-python", map[string]any{"cmd": "echo shared"}); b4Stdout(e) != "shared\n" || e.Context != "code-python" {
		t.Errorf("code-python: %+v", e)
	}
}

// TestCommandLifecycle: timeout, background, kill, interrupt and stdin;
// a command answers while code runs in the same context.
func TestCommandLifecycle(t *testing.T) {
	g := newGateway(t)
	b4Context(t, g, map[string]any{"id": "life"})

	t.Run("timeout", func(t *testing.T) {
		start := time.Now()
		e := g.command("life", map[string]any{"cmd": "echo before; sleep 60", "timeout": 0.5})
		if process(e) != "timed_out/137" || b4Stdout(e) != "before\n" {
			t.Errorf("timed out command: %s %q", process(e), b4Stdout(e))
		}
		if took := time.Since(start); took > 30*time.Second {
			t.Errorf("a 0.5 s timeout ended the command after %v", took)
		}
	})
	t.Run("background and kill", func(t *testing.T) {
		id := g.background("life", map[string]any{"cmd": "echo started; sleep 300"})
		g.waitStdout(id, "started", 30*time.Second)
		if state, _ := g.runModel(id); state != "running" {
			t.Fatalf("background command is %s", state)
		}
		if status, out := g.do("POST", "/api/runs/"+id+"/kill", nil); status != http.StatusNoContent {
			t.Fatalf("kill: %d %s", status, out)
		}
		if e := g.waitRun(id, 30*time.Second); process(e) != "killed/137" {
			t.Errorf("killed command: %s", process(e))
		}
	})
	t.Run("interrupt", func(t *testing.T) {
		id := g.background("life", map[string]any{"cmd": "trap 'echo got INT; exit 5' INT; echo ready; while :; do sleep 0.1; done"})
		g.waitStdout(id, "ready", 30*time.Second)
		if status, out := g.do("POST", "/api/runs/"+id+"/interrupt", nil); status != http.StatusNoContent {
			t.Fatalf("interrupt: %d %s", status, out)
		}
		e := g.waitRun(id, 30*time.Second)
		if process(e) != "interrupted/5" || !strings.Contains(b4Stdout(e), "got INT") {
			t.Errorf("interrupted command: %s %q", process(e), b4Stdout(e))
		}
	})
	t.Run("stdin", func(t *testing.T) {
		id := g.background("life", map[string]any{"cmd": "read a; echo got:$a; read b; echo got:$b", "stdin": true})
		for _, v := range []string{"one\n", "two\n"} {
			if status, out := g.do("POST", "/api/runs/"+id+"/input", map[string]string{"value": v}); status != http.StatusNoContent {
				t.Fatalf("input: %d %s", status, out)
			}
		}
		if e := g.waitRun(id, 30*time.Second); b4Stdout(e) != "got:one\ngot:two\n" || process(e) != "completed/0" {
			t.Errorf("stdin command: %s %q", process(e), b4Stdout(e))
		}
		// eof closes the input: a command reading to its end ends.
		id = g.background("life", map[string]any{"cmd": "wc -l", "stdin": true})
		if status, out := g.do("POST", "/api/runs/"+id+"/input", map[string]any{"value": "a\nb\n", "eof": true}); status != http.StatusNoContent {
			t.Fatalf("input with eof: %d %s", status, out)
		}
		if e := g.waitRun(id, 30*time.Second); strings.TrimSpace(b4Stdout(e)) != "2" || process(e) != "completed/0" {
			t.Errorf("wc -l after eof: %s %q", process(e), b4Stdout(e))
		}
		if status, _ := g.do("POST", "/api/runs/"+id+"/input", map[string]any{"eof": true}); status != http.StatusBadRequest {
			t.Errorf("eof on an ended command: %d", status)
		}
		// Without stdin the command reads an empty input, and no input is taken.
		e := g.command("life", map[string]any{"cmd": "cat; echo end"})
		if b4Stdout(e) != "end\n" {
			t.Errorf("command without stdin: %q", b4Stdout(e))
		}
		if status, _ := g.do("POST", "/api/runs/"+e.ID+"/input", map[string]string{"value": "x"}); status != http.StatusBadRequest {
			t.Errorf("input to an ended command: %d", status)
		}
	})
	t.Run("not queued behind code", func(t *testing.T) {
		started := make(chan string, 1)
		go func() {
			_, out, _ := g.send("POST", "/api/execute", map[string]any{"context": "life", "code": "import time\nfor _ in range(600): time.sleep(0.1)"}, g.auth())
			started <- string(out)
		}()
		checkFor(t, 30*time.Second, "the code to run", func() bool {
			_, out := g.do("GET", "/api/contexts/life", nil)
			return decode[sessions.ContextModel](t, out).ExecutionState == "busy"
		})
		e := g.command("life", map[string]any{"cmd": "echo beside", "timeout": 20})
		if b4Stdout(e) != "beside\n" || process(e) != "completed/0" {
			t.Errorf("command beside running code: %s %q", process(e), b4Stdout(e))
		}
		g.do("POST", "/api/contexts/life/interrupt", nil)
		if out := <-started; !strings.Contains(out, `"interrupted"`) {
			t.Errorf("the code run: %s", out)
		}
	})
}

// TestCommandStreaming: NDJSON and SSE events as code's, resumed after a seq.
func TestCommandStreaming(t *testing.T) {
	g := newGateway(t)
	b4Context(t, g, map[string]any{"id": "st"})
	status, body := g.doWith("POST", "/api/contexts/st/commands", map[string]any{"cmd": "echo one; echo two >&2; exit 2"},
		map[string]string{"Authorization": "token " + g.token, "Accept": "application/x-ndjson"})
	if status != 200 {
		t.Fatalf("streamed command: %d %s", status, body)
	}
	var types []string
	var end map[string]any
	var runID string
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("event %s: %v", sc.Bytes(), err)
		}
		types = append(types, ev["type"].(string))
		switch ev["type"] {
		case "start":
			runID, _ = ev["run"].(string)
		case "end":
			end = ev
		}
	}
	if len(types) < 3 || types[0] != "start" || types[len(types)-1] != "end" {
		t.Fatalf("events %v", types)
	}
	if p, _ := end["process"].(map[string]any); p["exitCode"] != 2.0 || p["reason"] != "completed" {
		t.Errorf("end %v", end)
	}
	// Resume after the start: everything after it, the end last.
	status, replay := g.doWith("GET", "/api/runs/"+runID+"/events?after=1", nil, map[string]string{"Authorization": "token " + g.token, "Accept": "text/event-stream"})
	if status != 200 || strings.Contains(string(replay), `"type":"start"`) || !strings.Contains(string(replay), "id: 2\n") ||
		!strings.Contains(string(replay), `"text":"one\n"`) || !strings.Contains(string(replay), `"type":"end"`) {
		t.Errorf("resumed events: %d %s", status, replay)
	}
}

// TestCommandStopsWithContext: deleting a context kills its commands,
// the children they started too, and their runs end "lost".
func TestCommandStopsWithContext(t *testing.T) {
	g := newGateway(t)
	b4Context(t, g, map[string]any{"id": "gone"})
	id := g.background("gone", map[string]any{"cmd": "sleep 300 & echo child:$!; echo self:$$; wait"})
	g.waitStdout(id, "self:", 30*time.Second)
	_, e := g.runModel(id)
	var pids []int
	for _, f := range strings.Fields(b4Stdout(e)) {
		_, n, _ := strings.Cut(f, ":")
		pid, err := strconv.Atoi(n)
		if err != nil {
			t.Fatalf("stdout %q", b4Stdout(e))
		}
		pids = append(pids, pid)
	}
	if status, _ := g.do("DELETE", "/api/contexts/gone", nil); status != http.StatusNoContent {
		t.Fatalf("delete: %d", status)
	}
	e = g.waitRun(id, 30*time.Second)
	if e.Process.Reason != runs.Lost || !strings.Contains(e.Process.Message, "deleted") {
		t.Errorf("command of a deleted context: %+v", e.Process)
	}
	checkFor(t, 30*time.Second, "the command's processes to go", func() bool {
		for _, pid := range pids {
			if syscall.Kill(pid, 0) == nil {
				return false
			}
		}
		return true
	})
}

// TestCommandOutputBounded: a command that floods stdout keeps the head
// and the tail within the run's limit, with the marker; one that never
// reads its stdin makes an input fail after a bounded wait.
func TestCommandOutputBounded(t *testing.T) {
	const limit = 64 << 10
	g := newGateway(t, func(m *sessions.Config, _ *Config) {
		m.RunLimits = runs.Limits{LogBytes: limit, ResultBytes: limit}
	})
	b4Context(t, g, map[string]any{"id": "flood"})
	e := g.command("flood", map[string]any{"cmd": "echo first; head -c 50000000 /dev/zero | tr '\\0' x; echo; echo last"})
	out := b4Stdout(e)
	if !e.Truncated || !strings.HasPrefix(out, "first\n") || !strings.HasSuffix(out, "\nlast\n") ||
		!strings.Contains(out, "output truncated") || len(out) > limit+200 {
		t.Errorf("flooded output: truncated %v, %d bytes, head %q tail %q", e.Truncated, len(out), out[:min(len(out), 20)], out[max(len(out)-20, 0):])
	}
	if process(e) != "completed/0" {
		t.Errorf("flood: %s", process(e))
	}

	id := g.background("flood", map[string]any{"cmd": "echo up; sleep 300", "stdin": true})
	g.waitStdout(id, "up", 30*time.Second)
	big := strings.Repeat("y", 1<<20)
	start := time.Now()
	status, body := g.do("POST", "/api/runs/"+id+"/input", map[string]string{"value": big})
	if status != http.StatusRequestTimeout || !strings.Contains(string(body), "REQUEST_TIMEOUT") {
		t.Errorf("input to a command that does not read: %d %s", status, body)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the input waited %v", took)
	}
	g.do("POST", "/api/runs/"+id+"/kill", nil)
	if e := g.waitRun(id, 30*time.Second); process(e) != "killed/137" {
		t.Errorf("killed: %s", process(e))
	}
}

// TestCommandForkBomb: a command is in its kernel's cgroup: a fork bomb
// meets the kernel's process limit, its timeout kills it all, and the
// kernel still runs code.
func TestCommandForkBomb(t *testing.T) {
	g := newGateway(t, func(m *sessions.Config, _ *Config) { m.KernelLimits = local.Limits{Pids: 128} })
	ctx := b4Context(t, g, map[string]any{"id": "bomb"})
	g.run(map[string]any{"context": "bomb", "code": "1"})
	_, out := g.do("GET", "/api/contexts/bomb", nil)
	ctx = decode[sessions.ContextModel](t, out)
	b4NeedCgroup(t, *ctx.KernelProcessID)
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", *ctx.KernelProcessID))
	if err != nil {
		t.Fatal(err)
	}
	if e := g.command("bomb", map[string]any{"cmd": "cat /proc/self/cgroup"}); b4Stdout(e) != string(cg) {
		t.Fatalf("a command's cgroups %q, its kernel's %q", b4Stdout(e), cg)
	}
	e := g.command("bomb", map[string]any{"cmd": "b() { b | b & }; b; sleep 60", "timeout": 3})
	if e.Process.Reason != runs.TimedOut {
		t.Errorf("fork bomb: %s", process(e))
	}
	if r := b4Result(g.run(map[string]any{"context": "bomb", "code": "6*7", "timeout": 30})); r != "42" {
		t.Errorf("the kernel after the fork bomb answered %q", r)
	}
	checkFor(t, 30*time.Second, "the fork bomb's processes to go", func() bool {
		return len(cgroupProcs(t, string(cg))) <= 1
	})
}

// cgroupProcs lists the processes of the cgroups /proc/pid/cgroup names.
func cgroupProcs(t *testing.T, procCgroup string) []string {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(procCgroup), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.Contains(parts[2], "/kernelgate/") {
			continue
		}
		for _, mnt := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/" + parts[1]} {
			if b, err := os.ReadFile(filepath.Join(mnt, parts[2], "cgroup.procs")); err == nil {
				return strings.Fields(string(b))
			}
		}
	}
	t.Fatalf("no kernelgate cgroup in %s", procCgroup)
	return nil
}

// TestCommandSandboxed: a sandboxed context's command runs in a sandbox
// built as its kernel's: it writes its own workspace, which its code
// reads, and sees nothing of another context's.
func TestCommandSandboxed(t *testing.T) {
	b4NeedSandbox(t)
	root := b4HostDir(t)
	g := newGateway(t, b4Sandboxed(local.SandboxConfig{}), func(m *sessions.Config, _ *Config) { m.Workspaces = mustRoot(t, root) })
	b4Context(t, g, map[string]any{"id": "a"})
	b := b4Context(t, g, map[string]any{"id": "b"})
	g.run(map[string]any{"context": "b", "code": "open('secret.txt', 'w').write('b only')"})

	e := g.command("a", map[string]any{"cmd": fmt.Sprintf("id -u; echo mine > mine.txt; cat %s/secret.txt; ls %s; echo ok", b.Cwd, b.Cwd)})
	out := b4Stdout(e)
	if strings.Contains(out, "b only") || strings.Contains(out, "secret.txt") || !strings.HasSuffix(out, "ok\n") {
		t.Errorf("a sandboxed command saw another context's workspace: %q %q", out, stderrOf(e))
	}
	if uid := strings.Fields(out); os.Geteuid() == 0 && (len(uid) == 0 || uid[0] == "0") {
		t.Errorf("a root gateway's sandboxed command ran as %v", uid)
	}
	if r := b4Result(g.run(map[string]any{"context": "a", "code": "open('mine.txt').read()"})); r != `'mine\n'` {
		t.Errorf("code read the sandboxed command's file as %s", r)
	}
	if _, err := os.Stat(filepath.Join(b.Cwd, "mine.txt")); err == nil {
		t.Errorf("a's command wrote into b's workspace")
	}
}

// TestCommandStopsWithGateway: a gateway that keeps its kernels for the
// next one (a state store, Detach) still stops its commands: they are its
// children, which no later gateway adopts.
func TestCommandStopsWithGateway(t *testing.T) {
	store, err := state.Open(filepath.Join(t.TempDir(), state.FileName), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	g := newGateway(t, func(m *sessions.Config, _ *Config) { m.Store = store })
	b4Context(t, g, map[string]any{"id": "kept"})
	id := g.background("kept", map[string]any{"cmd": "echo self:$$; sleep 60"})
	g.waitStdout(id, "self:", 30*time.Second)
	_, e := g.runModel(id)
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(b4Stdout(e), "self:")))
	if err != nil {
		t.Fatalf("stdout %q", b4Stdout(e))
	}
	run, err := g.mgr.Run(id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.mgr.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatalf("Detach waited for a command to end by itself")
	}
	<-run.Done()
	if syscall.Kill(pid, 0) == nil {
		t.Errorf("command %d outlived its gateway's Detach", pid)
	}
}

// TestCommandContextToken: a context token runs commands in its context,
// and reaches no other context's commands or runs.
func TestCommandContextToken(t *testing.T) {
	g := newGateway(t)
	b4Context(t, g, map[string]any{"id": "mine"})
	b4Context(t, g, map[string]any{"id": "theirs"})
	status, out := g.do("POST", "/api/contexts/mine/tokens", map[string]any{"ttl": 600})
	if status != http.StatusCreated && status != http.StatusOK {
		t.Fatalf("mint: %d %s", status, out)
	}
	tok := map[string]string{"Authorization": "Bearer " + decode[map[string]any](t, out)["token"].(string)}
	if status, out := g.doWith("POST", "/api/contexts/mine/commands", map[string]any{"cmd": "echo ok"}, tok); status != 200 || !strings.Contains(string(out), `"ok\n"`) {
		t.Errorf("own context: %d %s", status, out)
	}
	if status, out := g.doWith("POST", "/api/contexts/theirs/commands", map[string]any{"cmd": "echo no"}, tok); status != http.StatusForbidden {
		t.Errorf("another context: %d %s", status, out)
	}
	id := g.background("theirs", map[string]any{"cmd": "sleep 300"})
	if status, _ := g.doWith("POST", "/api/runs/"+id+"/kill", nil, tok); status != http.StatusForbidden {
		t.Errorf("kill of another context's command: %d", status)
	}
	g.do("POST", "/api/runs/"+id+"/kill", nil)
	g.waitRun(id, 30*time.Second)
}

// mkWheel writes a wheel of module kgdemo (a zip: pip needs no build or
// network to install it).
const mkWheel = `import zipfile
name = "kgdemo-1.0-py3-none-any.whl"
with zipfile.ZipFile(name, "w") as z:
    z.writestr("kgdemo.py", "ANSWER = 42\n")
    z.writestr("kgdemo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: kgdemo\nVersion: 1.0\n")
    z.writestr("kgdemo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr("kgdemo-1.0.dist-info/RECORD", "")
print(name)
`

// TestCommandPipInstall: pip install run as a command lands in the
// context's packages, which its code imports.
func TestCommandPipInstall(t *testing.T) {
	g := newGateway(t)
	b4Context(t, g, map[string]any{"id": "pip"})
	status, out := g.do("PUT", "/api/contexts/pip/files/mkwheel.py", mkWheel)
	if status != http.StatusCreated {
		t.Fatalf("upload: %d %s", status, out)
	}
	e := g.command("pip", map[string]any{"cmd": "python3 -m pip install --no-index $(python3 mkwheel.py)", "timeout": 120})
	if process(e) != "completed/0" {
		t.Fatalf("pip install: %s\n%s\n%s", process(e), b4Stdout(e), stderrOf(e))
	}
	if r := b4Result(g.run(map[string]any{"context": "pip", "code": "import importlib; importlib.invalidate_caches(); import kgdemo; kgdemo.ANSWER"})); r != "42" {
		t.Errorf("code imported the command's package as %q", r)
	}
	if _, err := os.Stat("/usr/lib/python3/dist-packages/kgdemo.py"); err == nil {
		t.Errorf("the package went into the system's Python")
	}
}

// TestCommandKeepsKernelFromCulling: a running command is activity: its
// kernel outlives an idle kernel culled meanwhile, and is culled once the
// command ended and the idle timeout passed.
func TestCommandKeepsKernelFromCulling(t *testing.T) {
	g := newGateway(t, func(m *sessions.Config, _ *Config) {
		m.CullIdleTimeout = 300 * time.Millisecond
		m.CullInterval = 50 * time.Millisecond
	})
	b4Context(t, g, map[string]any{"id": "busy"})
	id := g.background("busy", map[string]any{"cmd": "sleep 300"})
	_, out := g.do("GET", "/api/contexts/busy", nil)
	kernel := decode[sessions.ContextModel](t, out).KernelID
	if kernel == nil {
		t.Fatal("the command's context has no kernel")
	}
	idle := g.startKernel("python3")
	eventually(t, 30*time.Second, func() bool {
		status, _ := g.do("GET", "/api/kernels/"+idle.ID, nil)
		return status == 404
	})
	if status, _ := g.do("GET", "/api/kernels/"+*kernel, nil); status != 200 {
		t.Fatalf("the kernel of a context running a command was culled: %d", status)
	}
	g.do("POST", "/api/runs/"+id+"/kill", nil)
	g.waitRun(id, 30*time.Second)
	eventually(t, 30*time.Second, func() bool {
		status, _ := g.do("GET", "/api/kernels/"+*kernel, nil)
		return status == 404
	})
}

// TestCommandLostWithKernel: restarting a context's kernel ends the
// commands beside it, and their runs say so.
func TestCommandLostWithKernel(t *testing.T) {
	g := newGateway(t)
	b4Context(t, g, map[string]any{"id": "rs"})
	g.run(map[string]any{"context": "rs", "code": "1"})
	_, out := g.do("GET", "/api/contexts/rs", nil)
	b4NeedCgroup(t, *decode[sessions.ContextModel](t, out).KernelProcessID)
	id := g.background("rs", map[string]any{"cmd": "echo up; sleep 300"})
	g.waitStdout(id, "up", 30*time.Second)
	if status, out := g.do("POST", "/api/contexts/rs/restart", nil); status != 200 {
		t.Fatalf("restart: %d %s", status, out)
	}
	e := g.waitRun(id, 30*time.Second)
	if e.Process.Reason != runs.Lost || !strings.Contains(e.Process.Message, "restarted") {
		t.Errorf("a command whose kernel restarted: %+v", e.Process)
	}
}

// TestCommandBesideDeno: a command beside a Deno kernel (a kernel started
// by exec, not forked) shares its folder and its environment.
func TestCommandBesideDeno(t *testing.T) {
	g := newGateway(t)
	ctx := b4Context(t, g, map[string]any{"id": "js", "language": "javascript"})
	e := g.command("js", map[string]any{"cmd": "echo $DENO_DIR; echo from-sh > sh.txt"})
	if want := filepath.Join(ctx.Cwd, ".cache", "deno") + "\n"; b4Stdout(e) != want {
		t.Errorf("DENO_DIR of a command: %q, want %q (%s)", b4Stdout(e), want, stderrOf(e))
	}
	if r := b4Result(g.run(map[string]any{"context": "js", "code": "Deno.readTextFileSync('sh.txt').trim()"})); !strings.Contains(r, "from-sh") {
		t.Errorf("Deno read the command's file as %q", r)
	}
	_, out := g.do("GET", "/api/contexts/js", nil)
	pid := *decode[sessions.ContextModel](t, out).KernelProcessID
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	e = g.command("js", map[string]any{"cmd": []string{"printenv", "HOME"}})
	if !strings.Contains(string(environ), "\x00HOME="+strings.TrimSpace(b4Stdout(e))+"\x00") && !strings.HasPrefix(string(environ), "HOME="+strings.TrimSpace(b4Stdout(e))+"\x00") {
		t.Errorf("a command's HOME %q is not its kernel's", b4Stdout(e))
	}
}

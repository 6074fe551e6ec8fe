package gateway

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"kernelgate/sessions"
)

// command runs a command in a context and returns its Execution.
func (g *testGateway) command(ctx string, body map[string]any) sessions.Execution {
	g.t.Helper()
	status, out := g.do("POST", "/api/contexts/"+ctx+"/commands", body)
	if status != http.StatusOK {
		g.t.Fatalf("POST /api/contexts/%s/commands %v: %d %s", ctx, body, status, out)
	}
	return decode[sessions.Execution](g.t, out)
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
func (g *testGateway) runModel(id string) (state string, e sessions.Execution) {
	g.t.Helper()
	status, out := g.do("GET", "/api/runs/"+id, nil)
	if status != http.StatusOK {
		g.t.Fatalf("GET /api/runs/%s: %d %s", id, status, out)
	}
	var m struct {
		State     string             `json:"state"`
		Execution sessions.Execution `json:"execution"`
	}
	decodeInto(g.t, out, &m)
	return m.State, m.Execution
}

// waitRun waits for a run to end and returns its Execution.
func (g *testGateway) waitRun(id string, d time.Duration) sessions.Execution {
	g.t.Helper()
	var e sessions.Execution
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

func process(e sessions.Execution) string {
	return string(e.Process.Reason) + "/" + exitCode(e)
}

func stderrOf(e sessions.Execution) string { return strings.Join(e.Logs.Stderr, "") }

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

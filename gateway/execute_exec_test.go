//go:build linux

package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"kernelgate/sessions"
)

// TestExecuteKindExec: POST /api/execute with kind "exec" runs its code as
// a command beside the kernel (Daytona's kind "exec"): in a named context,
// sharing its folder and env with the kernel, or in the language's shared
// context; answered, listed and streamed as a run; bad bodies refused.
func TestExecuteKindExec(t *testing.T) {
	g := newGateway(t)
	ctx := b4Context(t, g, map[string]any{"id": "ex1", "env": map[string]string{"MY_SETTING": "v1"}})

	e := g.run(map[string]any{"kind": "exec", "context": "ex1", "code": "echo $MY_SETTING > from-exec.txt; pwd; echo err >&2; exit 4"})
	if b4Stdout(e) != ctx.Cwd+"\n" || stderrOf(e) != "err\n" || process(e) != "completed/4" || e.Context != "ex1" {
		t.Errorf("exec in ex1: stdout %q stderr %q process %s context %s", b4Stdout(e), stderrOf(e), process(e), e.Context)
	}
	if r := b4Result(g.run(map[string]any{"context": "ex1", "code": "open('from-exec.txt').read()"})); r != `'v1\n'` {
		t.Errorf("code read the command's file as %s", r)
	}
	status, out := g.do("GET", "/api/contexts/ex1", nil)
	if m := decode[sessions.ContextModel](t, out); status != 200 || !contains(m.ProcessIDs, e.ID) {
		t.Errorf("processIds %v lack the exec run %s", m.ProcessIDs, e.ID)
	}

	// Without a context: the shared context of the language.
	if e := g.run(map[string]any{"kind": "exec", "code": "echo shared $EXTRA", "env": map[string]string{"EXTRA": "x2"}}); b4Stdout(e) != "shared x2\n" || e.Context != "code-python" || process(e) != "completed/0" {
		t.Errorf("exec on the shared kernel: %q in %s (%s)", b4Stdout(e), e.Context, process(e))
	}
	// kind "code" is what a run is without kind.
	if r := b4Result(g.run(map[string]any{"kind": "code", "code": "6*7"})); r != "42" {
		t.Errorf("kind code: %s", r)
	}

	// Streamed: its events, then its end with the process.
	headers := g.auth()
	headers["Accept"] = "application/x-ndjson"
	headers["Content-Type"] = "application/json"
	resp, body := g.rawRequest("POST", "/api/execute", `{"kind": "exec", "context": "ex1", "code": "echo one; echo two >&2"}`, headers)
	if resp.StatusCode != 200 {
		t.Fatalf("streamed exec: %d %s", resp.StatusCode, body)
	}
	var kinds []string
	var end struct {
		Process struct {
			Reason string `json:"reason"`
		} `json:"process"`
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		var ev struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("event %q: %v", sc.Text(), err)
		}
		kinds = append(kinds, ev.Type)
		if ev.Type == "end" {
			if err := json.Unmarshal(sc.Bytes(), &end); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := strings.Join(kinds, ","); !strings.Contains(got, "stdout") || !strings.Contains(got, "stderr") || !strings.HasSuffix(got, "end") || end.Process.Reason != "completed" {
		t.Errorf("streamed exec events %s, end %+v", got, end)
	}

	for _, tc := range []struct {
		body   map[string]any
		status int
		code   string
	}{
		{map[string]any{"kind": "shell", "code": "true"}, 400, "BAD_REQUEST"},
		{map[string]any{"kind": "exec", "code": ""}, 400, "BAD_REQUEST"},
		{map[string]any{"kind": "exec", "code": "true", "isolated": true}, 400, "BAD_REQUEST"},
		{map[string]any{"kind": "exec", "code": "true", "stdin": true}, 400, "BAD_REQUEST"},
		{map[string]any{"kind": "exec", "code": "true", "context": "ex1", "cwd": "../.."}, 400, "BAD_REQUEST"},
		{map[string]any{"kind": "exec", "code": "true", "context": "nope"}, 404, "SESSION_NOT_FOUND"},
	} {
		status, out := g.do("POST", "/api/execute", tc.body)
		if status != tc.status || !strings.Contains(string(out), `"`+tc.code+`"`) {
			t.Errorf("%v: %d %s, want %d %s", tc.body, status, out, tc.status, tc.code)
		}
	}
}

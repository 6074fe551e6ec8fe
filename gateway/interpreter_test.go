package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/sysproc"
	"kernelgate/runs"
	"kernelgate/sessions"
)

// run posts /api/execute and decodes the Execution.
func (g *testGateway) run(body map[string]any) runs.Execution {
	g.t.Helper()
	status, out := g.do("POST", "/api/execute", body)
	if status != 200 {
		g.t.Fatalf("POST /api/execute %v: %d %s", body, status, out)
	}
	return decode[runs.Execution](g.t, out)
}

func exitCode(e runs.Execution) string {
	if e.Process.ExitCode == nil {
		return "none"
	}
	return strconv.Itoa(*e.Process.ExitCode)
}

func TestExecuteSeeds(t *testing.T) {
	g := newGateway(t, func(m *sessions.Config, _ *Config) { m.PoolSize = 1 })
	t.Run("shared kernel keeps state", func(t *testing.T) {
		g.run(map[string]any{"code": "sales = [120, 95]"})
		e := g.run(map[string]any{"code": "sum(sales)"})
		if len(e.Results) != 1 || e.Results[0].Text != "215" || !e.Results[0].IsMainResult {
			t.Fatalf("results %+v", e.Results)
		}
		if e.ExecutionCount == nil || *e.ExecutionCount != 2 || e.Error != nil || e.Context != "code-python" {
			t.Errorf("execution %+v", e)
		}
		if e.Process.Reason != runs.Completed || exitCode(e) != "0" {
			t.Errorf("process %+v", e.Process)
		}
	})
	t.Run("context env", func(t *testing.T) {
		status, body := g.do("POST", "/api/contexts", map[string]any{"language": "python", "env": map[string]string{"REGION": "east"}})
		if status != 201 {
			t.Fatalf("%d %s", status, body)
		}
		ctx := decode[sessions.ContextModel](t, body)
		if !ctx.Active || ctx.KernelID == nil || len(ctx.Env) != 1 || ctx.Env[0] != "REGION" {
			t.Errorf("context %s", body)
		}
		e := g.run(map[string]any{"code": "import os; os.environ['REGION']", "context": ctx.ID})
		if len(e.Results) != 1 || e.Results[0].Text != "'east'" {
			t.Errorf("results %+v", e.Results)
		}
	})
	t.Run("javascript", func(t *testing.T) {
		e := g.run(map[string]any{"code": "[2, 3, 5, 7].reduce((a, b) => a + b)", "language": "javascript"})
		if len(e.Results) != 1 || e.Results[0].Text != "17" {
			t.Fatalf("results %+v", e.Results)
		}
		if !strings.Contains(string(e.Results[0].Data["text/plain"]), `\u001b[`) {
			t.Errorf("data should stay as the kernel sent it (with colours): %s", e.Results[0].Data["text/plain"])
		}
	})
	t.Run("typescript", func(t *testing.T) {
		e := g.run(map[string]any{"code": "const n: number = 40; console.log('ts'); n + 2", "language": "typescript"})
		if len(e.Results) != 1 || e.Results[0].Text != "42" || len(e.Logs.Stdout) != 1 || e.Logs.Stdout[0] != "ts\n" {
			t.Fatalf("execution %+v", e)
		}
	})
	t.Run("isolated has no state", func(t *testing.T) {
		g.run(map[string]any{"code": "value = 42"})
		e := g.run(map[string]any{"code": "print(value)", "isolated": true})
		if e.Error == nil || e.Error.Name != "NameError" || e.Process.Reason != runs.Errored || exitCode(e) != "1" {
			t.Fatalf("execution %+v", e)
		}
		for _, line := range e.Error.Traceback {
			if strings.Contains(line, "\x1b") {
				t.Errorf("traceback keeps ANSI codes: %q", line)
			}
		}
		if e.Error.Message != e.Error.Value {
			t.Errorf("message %q != value %q", e.Error.Message, e.Error.Value)
		}
	})
	t.Run("isolated cwd and env", func(t *testing.T) {
		// cwd is a folder of the run's fresh workspace.
		e := g.run(map[string]any{"code": "import os; (os.getcwd().endswith('/proj'), os.environ['MODE'])", "isolated": true, "cwd": "proj", "env": map[string]string{"MODE": "iso"}})
		if want := "(True, 'iso')"; len(e.Results) != 1 || e.Results[0].Text != want {
			t.Fatalf("results %+v, want %s", e.Results, want)
		}
	})
	t.Run("dataframe", func(t *testing.T) {
		e := g.run(map[string]any{"code": "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})"})
		if len(e.Results) != 1 || e.Results[0].HTML == "" || e.Results[0].Text == "" {
			t.Fatalf("results %+v", e.Results)
		}
	})
	t.Run("matplotlib", func(t *testing.T) {
		e := g.run(map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"})
		if len(e.Results) != 1 || len(e.Results[0].PNG) < 100 || e.Results[0].IsMainResult {
			t.Fatalf("results %+v", e.Results)
		}
	})
	t.Run("stdout and stderr", func(t *testing.T) {
		e := g.run(map[string]any{"code": "import sys\nprint('out')\nprint('err', file=sys.stderr)"})
		if strings.Join(e.Logs.Stdout, "") != "out\n" || strings.Join(e.Logs.Stderr, "") != "err\n" {
			t.Fatalf("logs %+v", e.Logs)
		}
	})
	t.Run("input without stdin fails fast", func(t *testing.T) {
		e := g.run(map[string]any{"code": "input('name? ')", "timeout": 10})
		if e.Error == nil || e.Error.Name != "StdinNotImplementedError" {
			t.Fatalf("execution %+v", e)
		}
	})
	t.Run("display updates and clear_output", func(t *testing.T) {
		code := "from IPython.display import display, clear_output\n" +
			"h = display('step 0', display_id=True)\n" +
			"for i in range(1, 4): h.update(f'step {i}')\n" +
			"print('before clear')\nclear_output(wait=True)\nprint('after clear')"
		e := g.run(map[string]any{"code": code})
		if strings.Join(e.Logs.Stdout, "") != "after clear\n" || len(e.Results) != 0 {
			t.Fatalf("after clear_output(wait=True): %+v", e)
		}
		e = g.run(map[string]any{"code": "h = display('step 0', display_id=True)\nfor i in range(1, 4): h.update(f'step {i}')"})
		if len(e.Results) != 1 || e.Results[0].Text != "'step 3'" || e.Results[0].DisplayID == "" {
			t.Fatalf("updated display: %+v", e.Results)
		}
	})
}

func TestExecuteErrorCodes(t *testing.T) {
	g := newGateway(t, func(m *sessions.Config, _ *Config) {
		m.QueueLimit = 1
		m.PoolSize = 0
		m.MaxKernels = 3
		m.Languages = map[string]string{"python": "python3", "javascript": "deno", "typescript": "deno", "broken": "broken"}
	})
	// A kernelspec whose kernel cannot start.
	dir := t.TempDir()
	os.MkdirAll(dir+"/broken", 0o755)
	os.WriteFile(dir+"/broken/kernel.json", []byte(`{"argv":["/usr/bin/python3","-c","import sys; print('kernel exploded', file=sys.stderr); sys.exit(1)","{connection_file}"],"display_name":"b","language":"python"}`), 0o644)
	g.mgr.Catalog().Specs() // the catalog is fixed: make the broken spec visible through a second gateway
	gb := newGatewayWithDirs(t, []string{dir}, func(m *sessions.Config, _ *Config) {
		m.Languages = map[string]string{"python": "broken"}
	})

	status, body := g.do("POST", "/api/contexts", map[string]any{"id": "busy"})
	if status != 201 {
		t.Fatalf("%d %s", status, body)
	}
	cases := []struct {
		name   string
		gw     *testGateway
		method string
		path   string
		body   any
		hdr    map[string]string
		status int
		code   string
	}{
		{"malformed JSON", g, "POST", "/api/execute", `{"code":`, nil, 400, "BAD_REQUEST"},
		{"missing code", g, "POST", "/api/execute", map[string]any{"language": "python"}, nil, 400, "BAD_REQUEST"},
		{"field in another case", g, "POST", "/api/execute", `{"code":"1","Language":"python"}`, nil, 400, "BAD_REQUEST"},
		{"unknown escaped field", g, "POST", "/api/execute", `{"code":"1","langu\u0061ges":"python"}`, nil, 400, "BAD_REQUEST"},
		{"not an object", g, "POST", "/api/execute", `["code"]`, nil, 400, "BAD_REQUEST"},
		{"unknown language", g, "POST", "/api/execute", map[string]any{"code": "1", "language": "cobol"}, nil, 400, "BAD_REQUEST"},
		{"isolated with context", g, "POST", "/api/execute", map[string]any{"code": "1", "isolated": true, "context": "busy"}, nil, 400, "BAD_REQUEST"},
		{"env with context", g, "POST", "/api/execute", map[string]any{"code": "1", "context": "busy", "env": map[string]string{"A": "b"}}, nil, 400, "BAD_REQUEST"},
		{"language mismatch", g, "POST", "/api/execute", map[string]any{"code": "1", "context": "busy", "language": "javascript"}, nil, 400, "BAD_REQUEST"},
		{"denied env name", g, "POST", "/api/execute", map[string]any{"code": "1", "isolated": true, "env": map[string]string{"LD_PRELOAD": "/x.so"}}, nil, 400, "BAD_REQUEST"},
		{"bad context id", g, "POST", "/api/contexts", map[string]any{"id": "no spaces allowed"}, nil, 400, "BAD_REQUEST"},
		{"long context id", g, "POST", "/api/contexts", map[string]any{"id": strings.Repeat("a", 129)}, nil, 400, "BAD_REQUEST"},
		{"no credentials", g, "POST", "/api/execute", map[string]any{"code": "1"}, map[string]string{}, 401, "UNAUTHORIZED"},
		{"wrong credentials", g, "GET", "/api/contexts", nil, map[string]string{"Authorization": "Bearer wrong"}, 401, "UNAUTHORIZED"},
		{"unknown context", g, "POST", "/api/execute", map[string]any{"code": "1", "context": "nope"}, nil, 404, "SESSION_NOT_FOUND"},
		{"get unknown context", g, "GET", "/api/contexts/nope", nil, nil, 404, "SESSION_NOT_FOUND"},
		{"delete unknown context", g, "DELETE", "/api/contexts/nope", nil, nil, 404, "SESSION_NOT_FOUND"},
		{"interrupt unknown context", g, "POST", "/api/contexts/nope/interrupt", nil, nil, 404, "SESSION_NOT_FOUND"},
		{"restart unknown context", g, "POST", "/api/contexts/nope/restart", nil, nil, 404, "SESSION_NOT_FOUND"},
		{"unknown run", g, "GET", "/api/runs/nope", nil, nil, 404, "NOT_FOUND"},
		{"unknown run events", g, "GET", "/api/runs/nope/events", nil, nil, 404, "NOT_FOUND"},
		{"unknown route", g, "GET", "/api/nothing/here", nil, nil, 404, "NOT_FOUND"},
		{"duplicate context", g, "POST", "/api/contexts", map[string]any{"id": "busy"}, nil, 409, "NAME_CONFLICT"},
		{"too large", g, "POST", "/api/execute", `{"code":"` + strings.Repeat("x", 17<<20) + `"}`, nil, 413, "PAYLOAD_TOO_LARGE"},
		{"not JSON", g, "POST", "/api/execute", "code=1", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415, "UNSUPPORTED_MEDIA_TYPE"},
		{"kernel start failed", gb, "POST", "/api/execute", map[string]any{"code": "1"}, nil, 503, "KERNEL_START_FAILED"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hdr := map[string]string{"Authorization": "token " + c.gw.token, "Content-Type": "application/json"}
			if c.hdr != nil {
				if len(c.hdr) == 0 {
					delete(hdr, "Authorization")
				}
				for k, v := range c.hdr {
					hdr[k] = v
				}
			}
			status, body := c.gw.doWith(c.method, c.path, c.body, hdr)
			got := decode[map[string]any](t, body)
			if status != c.status || got["code"] != c.code || got["message"] == "" {
				t.Fatalf("%d %s, want %d %s", status, body, c.status, c.code)
			}
			if c.code == "KERNEL_START_FAILED" && !strings.Contains(got["message"].(string), "kernel exploded") {
				t.Errorf("message lacks the kernel's output: %s", got["message"])
			}
		})
	}

	t.Run("unsupported env on the shared kernel", func(t *testing.T) {
		g.run(map[string]any{"code": "1", "env": map[string]string{"A": "1"}})
		status, body := g.do("POST", "/api/execute", map[string]any{"code": "1", "env": map[string]string{"A": "2"}})
		if got := decode[map[string]any](t, body); status != 409 || got["code"] != "UNSUPPORTED_OPERATION" {
			t.Fatalf("%d %s", status, body)
		}
		if e := g.run(map[string]any{"code": "2", "env": map[string]string{"A": "1"}}); e.Process.Reason != runs.Completed {
			t.Errorf("same env refused: %+v", e.Process)
		}
	})
	t.Run("queue full", func(t *testing.T) {
		first := startStream(t, g, map[string]any{"code": "import time; print('running', flush=True); time.sleep(3)", "context": "busy"})
		defer first.Body.Close()
		// The first runs (it left the queue) before the second is queued.
		if evs := readEvents(t, bufio.NewScanner(first.Body), func(ev event) bool { return ev.Type == "stdout" }); len(evs) == 0 || evs[len(evs)-1].Type != "stdout" {
			t.Fatalf("the first run did not print: %+v", evs)
		}
		second := startStream(t, g, map[string]any{"code": "1", "context": "busy"})
		defer second.Body.Close()
		status, body := g.do("POST", "/api/execute", map[string]any{"code": "1", "context": "busy"})
		if got := decode[map[string]any](t, body); status != 429 || got["code"] != "QUEUE_FULL" {
			t.Fatalf("%d %s", status, body)
		}
	})
	t.Run("resource exhausted", func(t *testing.T) {
		// busy, code-python and this one make three.
		g.do("POST", "/api/contexts", map[string]any{"id": "third"})
		status, body := g.do("POST", "/api/contexts", map[string]any{"id": "fourth"})
		if got := decode[map[string]any](t, body); status != 429 || got["code"] != "RESOURCE_EXHAUSTED" {
			t.Fatalf("%d %s", status, body)
		}
		g.do("DELETE", "/api/contexts/third", nil)
	})
	t.Run("request timeout", func(t *testing.T) {
		status, body := g.do("POST", "/api/execute", map[string]any{"code": "1", "isolated": true, "timeout": 0.05})
		if got := decode[map[string]any](t, body); status != 408 || got["code"] != "REQUEST_TIMEOUT" {
			t.Fatalf("%d %s", status, body)
		}
	})
}

// startStream starts a streamed run and returns its body.
func startStream(t *testing.T, g *testGateway, body map[string]any) *http.Response {
	t.Helper()
	js, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", g.url+"/api/execute", strings.NewReader(string(js)))
	req.Header.Set("Authorization", "token "+g.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	return resp
}

type event struct {
	Type           string            `json:"type"`
	Seq            int               `json:"seq"`
	Text           string            `json:"text"`
	Run            string            `json:"run"`
	Prompt         string            `json:"prompt"`
	Process        runs.ProcessState `json:"process"`
	ExecutionCount *int              `json:"executionCount"`
	Truncated      bool              `json:"truncated"`
	Result         *runs.Result      `json:"-"`
	Raw            json.RawMessage   `json:"-"`
}

func readEvents(t *testing.T, sc *bufio.Scanner, stop func(event) bool) []event {
	t.Helper()
	var out []event
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("bad event line %q: %v", sc.Text(), err)
		}
		e.Raw = append(json.RawMessage{}, sc.Bytes()...)
		out = append(out, e)
		if stop(e) {
			return out
		}
	}
	return out
}

func TestTimeouts(t *testing.T) {
	g := newGateway(t)
	g.run(map[string]any{"code": "kept = 'yes'"})
	// A run that runs past its timeout, seen running before the next is
	// queued behind it.
	resp := startStream(t, g, map[string]any{"code": "import time; print('go', flush=True); time.sleep(30)", "timeout": 2})
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	readEvents(t, sc, func(e event) bool { return e.Type == "stdout" })
	// Queued behind it; its timeout ends before its turn.
	q := g.run(map[string]any{"code": "print('never')", "timeout": 1})
	if q.Process.Reason != runs.TimedOut || q.Process.ExitCode != nil || len(q.Logs.Stdout) != 0 {
		t.Errorf("queued run: %+v", q)
	}
	evs := readEvents(t, sc, func(e event) bool { return e.Type == "end" })
	if end := evs[len(evs)-1]; end.Type != "end" || end.Process.Reason != runs.TimedOut || end.Process.ExitCode == nil || *end.Process.ExitCode != 1 {
		t.Fatalf("timed out run: %s", end.Raw)
	}
	if e := g.run(map[string]any{"code": "kept"}); len(e.Results) != 1 || e.Results[0].Text != "'yes'" {
		t.Errorf("state after timeout: %+v", e.Results)
	}
}

func TestWedgedDenoIsRestarted(t *testing.T) {
	g := newGateway(t, func(m *sessions.Config, _ *Config) { m.InterruptGrace = time.Second })
	g.run(map[string]any{"code": "let before = 1", "language": "typescript"})
	t0 := time.Now()
	e := g.run(map[string]any{"code": "await new Promise((r) => setTimeout(r, 30000))", "language": "typescript", "timeout": 1})
	if e.Process.Reason != runs.Lost || time.Since(t0) > 10*time.Second {
		t.Fatalf("process %+v after %v", e.Process, time.Since(t0))
	}
	after := g.run(map[string]any{"code": "typeof before", "language": "typescript"})
	if len(after.Results) != 1 || after.Results[0].Text != `"undefined"` {
		t.Errorf("after restart: %+v", after.Results)
	}
}

// A Deno run ends as soon as its execute_result has come, without the
// quiet period for late output: Deno publishes the result after the run's
// other output. With a quiet period of a minute, twenty runs finish well
// within it, each with all its output; a run without a result still gets
// output that comes after the idle status.
func TestDenoResultEndsTheLateOutputWait(t *testing.T) {
	g := newGateway(t, func(m *sessions.Config, _ *Config) { m.LateOutputWait = time.Minute })
	client := &http.Client{Timeout: 30 * time.Second}
	for i := range 20 {
		body := fmt.Sprintf(`{"code": "console.log('a'); console.error('b'); console.log('c'); %d * 2", "language": "javascript"}`, i)
		req, _ := http.NewRequest("POST", g.url+"/api/execute", strings.NewReader(body))
		req.Header.Set("Authorization", "token "+g.token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("run %d (a run with a result must not wait the quiet period): %v", i, err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		e := decode[runs.Execution](t, out)
		stdout, stderr := strings.Join(e.Logs.Stdout, ""), strings.Join(e.Logs.Stderr, "")
		if len(e.Results) != 1 || e.Results[0].Text != strconv.Itoa(i*2) || stdout != "a\nc\n" || stderr != "b\n" {
			t.Fatalf("run %d: results %+v, stdout %q, stderr %q", i, e.Results, stdout, stderr)
		}
	}

	short := newGateway(t, func(m *sessions.Config, _ *Config) { m.LateOutputWait = 200 * time.Millisecond })
	for i := range 5 {
		e := short.run(map[string]any{"code": fmt.Sprintf("for (let j = 0; j < 3; j++) console.log(%d + j)", i), "language": "javascript"})
		if want := fmt.Sprintf("%d\n%d\n%d\n", i, i+1, i+2); strings.Join(e.Logs.Stdout, "") != want || len(e.Results) != 0 {
			t.Errorf("run without a result: stdout %q (want %q), results %+v", strings.Join(e.Logs.Stdout, ""), want, e.Results)
		}
	}
}

// Waited runs on one context run one at a time in arrival order: the
// first runs on its request's goroutine, and those queued behind it are
// taken over by a worker when it ends.
func TestWaitedRunsRunInArrivalOrder(t *testing.T) {
	g := newGateway(t)
	if status, body := g.do("POST", "/api/contexts", map[string]any{"id": "q"}); status != 201 {
		t.Fatalf("%d %s", status, body)
	}
	dir := t.TempDir()
	start, goAhead := filepath.Join(dir, "started"), filepath.Join(dir, "go")
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for !ok() {
			select {
			case <-deadline:
				t.Fatalf("timed out waiting for %s", what)
			case <-tick.C:
			}
		}
	}
	queued := func(n int) func() bool {
		return func() bool {
			_, body := g.do("GET", "/api/contexts/q", nil)
			return len(decode[sessions.ContextModel](t, body).ProcessIDs) >= n
		}
	}
	type answer struct {
		i int
		e runs.Execution
	}
	answers := make(chan answer, 3)
	post := func(i int, code string) {
		js, _ := json.Marshal(map[string]any{"code": code, "context": "q"})
		req, _ := http.NewRequest("POST", g.url+"/api/execute", strings.NewReader(string(js)))
		req.Header.Set("Authorization", "token "+g.token)
		req.Header.Set("Content-Type", "application/json")
		var e runs.Execution
		if resp, err := http.DefaultClient.Do(req); err == nil {
			json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
		}
		answers <- answer{i, e}
	}
	go post(0, fmt.Sprintf("import os, time\nopen(%q, 'w').close()\nwhile not os.path.exists(%q): time.sleep(0.01)\n'a'", start, goAhead))
	waitFor("the first run to start", func() bool { _, err := os.Stat(start); return err == nil })
	go post(1, "'b'")
	waitFor("the second run to be queued", queued(2))
	go post(2, "'c'")
	waitFor("the third run to be queued", queued(3))
	if err := os.WriteFile(goAhead, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got := make([]runs.Execution, 3)
	for range 3 {
		select {
		case a := <-answers:
			got[a.i] = a.e
		case <-time.After(60 * time.Second):
			t.Fatal("a run did not end")
		}
	}
	for i, want := range []string{"'a'", "'b'", "'c'"} {
		e := got[i]
		if len(e.Results) != 1 || e.Results[0].Text != want || e.ExecutionCount == nil {
			t.Fatalf("run %d: %+v", i, e)
		}
		if i > 0 && *e.ExecutionCount <= *got[i-1].ExecutionCount {
			t.Errorf("run %d has execution count %d after %d: not run in arrival order", i, *e.ExecutionCount, *got[i-1].ExecutionCount)
		}
	}
}

func TestKilledContextKernelIsLost(t *testing.T) {
	g := newGateway(t)
	status, body := g.do("POST", "/api/contexts", map[string]any{"id": "victim"})
	if status != 201 {
		t.Fatal(status, string(body))
	}
	g.run(map[string]any{"code": "x = 1", "context": "victim"})
	resp := startStream(t, g, map[string]any{"code": "import time; print('started', flush=True); time.sleep(30)", "context": "victim"})
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	readEvents(t, sc, func(e event) bool { return e.Type == "stdout" })
	ctx := decode[sessions.ContextModel](t, mustGet(t, g, "/api/contexts/victim"))
	t0 := time.Now()
	sysproc.Kill(*ctx.KernelProcessID, syscall.SIGKILL)
	evs := readEvents(t, sc, func(e event) bool { return e.Type == "end" })
	end := evs[len(evs)-1]
	if end.Type != "end" || end.Process.Reason != runs.Lost || end.Process.ExitCode != nil || !strings.Contains(end.Process.Message, "killed") {
		t.Fatalf("end %s", end.Raw)
	}
	if took := time.Since(t0); took > 5*time.Second {
		t.Errorf("lost after %v", took)
	}
	eventually(t, 5*time.Second, func() bool {
		return !decode[sessions.ContextModel](t, mustGet(t, g, "/api/contexts/victim")).Active
	})
	e := g.run(map[string]any{"code": "x", "context": "victim"})
	if e.Error == nil || e.Error.Name != "NameError" {
		t.Errorf("next run: %+v", e)
	}
	if !decode[sessions.ContextModel](t, mustGet(t, g, "/api/contexts/victim")).Active {
		t.Errorf("context not active after the next run")
	}
}

func mustGet(t *testing.T, g *testGateway, path string) []byte {
	t.Helper()
	status, body := g.do("GET", path, nil)
	if status != 200 {
		t.Fatalf("GET %s: %d %s", path, status, body)
	}
	return body
}

func TestStreamingAndResume(t *testing.T) {
	g := newGateway(t)
	g.run(map[string]any{"code": "'warm'"}) // the shared kernel is started
	code := "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.5)"
	t0 := time.Now()
	resp := startStream(t, g, map[string]any{"code": code})
	sc := bufio.NewScanner(resp.Body)
	first := readEvents(t, sc, func(e event) bool { return e.Type == "stdout" })
	if took := time.Since(t0); took > time.Second {
		t.Errorf("first output after %v: not live", took)
	}
	if first[0].Type != "start" || first[0].Seq != 1 || first[0].Run == "" {
		t.Fatalf("first event %s", first[0].Raw)
	}
	runID := first[0].Run
	lastSeq := first[len(first)-1].Seq
	resp.Body.Close() // the client goes away; the run goes on

	req, _ := http.NewRequest("GET", fmt.Sprintf("%s/api/runs/%s/events?after=%d", g.url, runID, lastSeq), nil)
	req.Header.Set("Authorization", "token "+g.token)
	req.Header.Set("Accept", "text/event-stream")
	resp2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	sc2 := bufio.NewScanner(resp2.Body)
	var rest []event
	for sc2.Scan() {
		line := sc2.Text()
		if js, ok := strings.CutPrefix(line, "data: "); ok {
			var e event
			json.Unmarshal([]byte(js), &e)
			rest = append(rest, e)
			if e.Type == "end" {
				break
			}
		}
	}
	var outs []string
	prev := lastSeq
	for _, e := range rest {
		if e.Type == "keepalive" {
			continue
		}
		if e.Seq != prev+1 {
			t.Errorf("seq %d after %d", e.Seq, prev)
		}
		prev = e.Seq
		if e.Type == "stdout" {
			outs = append(outs, e.Text)
		}
	}
	if strings.Join(outs, "") != "1\n2\n" {
		t.Errorf("resumed stdout %q, want the rest once", outs)
	}
	if end := rest[len(rest)-1]; end.Type != "end" || end.Process.Reason != runs.Completed {
		t.Errorf("end %+v", end)
	}
	// The record stays readable.
	rm := decode[runs.RunModel](t, mustGet(t, g, "/api/runs/"+runID))
	if rm.State != runs.RunDone {
		t.Errorf("run state %s", rm.State)
	}
}

func TestStreamedStdin(t *testing.T) {
	g := newGateway(t)
	resp := startStream(t, g, map[string]any{"code": "name = input('name? ')\nprint('hello', name)", "stdin": true})
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	evs := readEvents(t, sc, func(e event) bool { return e.Type == "input_request" })
	if last := evs[len(evs)-1]; last.Type != "input_request" || last.Prompt != "name? " {
		t.Fatalf("got %s", last.Raw)
	}
	status, body := g.do("POST", "/api/runs/"+evs[0].Run+"/input", map[string]string{"value": "ada"})
	if status != 204 {
		t.Fatalf("input: %d %s", status, body)
	}
	evs = readEvents(t, sc, func(e event) bool { return e.Type == "end" })
	var out string
	for _, e := range evs {
		if e.Type == "stdout" {
			out += e.Text
		}
	}
	if out != "hello ada\n" {
		t.Errorf("stdout %q", out)
	}
}

func TestRunInterrupt(t *testing.T) {
	g := newGateway(t)
	resp := startStream(t, g, map[string]any{"code": "import time; print('go', flush=True); time.sleep(30)"})
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	evs := readEvents(t, sc, func(e event) bool { return e.Type == "stdout" })
	if status, _ := g.do("POST", "/api/runs/"+evs[0].Run+"/interrupt", nil); status != 204 {
		t.Fatalf("interrupt: %d", status)
	}
	evs = readEvents(t, sc, func(e event) bool { return e.Type == "end" })
	if end := evs[len(evs)-1]; end.Process.Reason != runs.Interrupted || end.Process.ExitCode == nil || *end.Process.ExitCode != 1 {
		t.Errorf("end %s", end.Raw)
	}
}

// rssBytes is this process's resident memory.
func rssBytes(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

func TestContextKernelOnJupyterSurface(t *testing.T) {
	g := newGateway(t)
	status, body := g.do("POST", "/api/contexts", map[string]any{"id": "watched"})
	if status != 201 {
		t.Fatal(status, string(body))
	}
	ctx := decode[sessions.ContextModel](t, body)
	_, body = g.do("GET", "/api/kernels", nil)
	found := false
	for _, k := range decode[[]sessions.KernelModel](t, body) {
		found = found || k.ID == *ctx.KernelID
	}
	if !found {
		t.Fatalf("context kernel %s not in /api/kernels: %s", *ctx.KernelID, body)
	}
	c := g.mustDial(*ctx.KernelID, true)
	g.run(map[string]any{"code": "print('from the api')", "context": "watched"})
	got := c.until(10*time.Second, func(m wsMsg) bool { return m.Header.MsgType == "stream" })
	if last := got[len(got)-1]; last.text(t) != "from the api\n" {
		t.Errorf("websocket saw %q", last.text(t))
	}
	// The watcher can continue the context's state.
	c.run("shared_state = 7")
	if e := g.run(map[string]any{"code": "shared_state", "context": "watched"}); len(e.Results) != 1 || e.Results[0].Text != "7" {
		t.Errorf("results %+v", e.Results)
	}
	// Contexts list includes the shared kernels that have run.
	g.run(map[string]any{"code": "1"})
	ids := []string{}
	_, body = g.do("GET", "/api/contexts", nil)
	for _, c := range decode[[]sessions.ContextModel](t, body) {
		ids = append(ids, c.ID)
	}
	if strings.Join(ids, ",") != "watched,code-python" {
		t.Errorf("contexts %v", ids)
	}
	if status, _ := g.do("DELETE", "/api/contexts/watched", nil); status != 204 {
		t.Errorf("delete %d", status)
	}
	if status, _ := g.do("GET", "/api/kernels/"+*ctx.KernelID, nil); status != 404 {
		t.Errorf("kernel of deleted context: %d", status)
	}
}

func TestContextInterruptRestartAndRuns(t *testing.T) {
	g := newGateway(t)
	g.do("POST", "/api/contexts", map[string]any{"id": "ops"})
	first := g.run(map[string]any{"code": "x = 1", "context": "ops"})
	// A run goes on when its client goes away; its id is in processIds.
	// It waits for a file the test makes once the client is gone.
	release := filepath.Join(t.TempDir(), "release")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	js, _ := json.Marshal(map[string]any{"code": fmt.Sprintf("import os, time\nwhile not os.path.exists(%q): time.sleep(0.01)\ny = 2", release), "context": "ops"})
	req, _ := http.NewRequestWithContext(ctx, "POST", g.url+"/api/execute", strings.NewReader(string(js)))
	req.Header.Set("Authorization", "token "+g.token)
	req.Header.Set("Content-Type", "application/json")
	answered := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		answered <- err
	}()
	eventually(t, 5*time.Second, func() bool {
		return len(decode[sessions.ContextModel](t, mustGet(t, g, "/api/contexts/ops")).ProcessIDs) == 2
	})
	cancel()
	if err := <-answered; err == nil {
		t.Fatal("the request was not cancelled")
	}
	cm := decode[sessions.ContextModel](t, mustGet(t, g, "/api/contexts/ops"))
	if len(cm.ProcessIDs) != 2 || cm.ProcessIDs[0] != first.ID {
		t.Fatalf("processIds %v", cm.ProcessIDs)
	}
	if run := decode[runs.RunModel](t, mustGet(t, g, "/api/runs/"+cm.ProcessIDs[1])); run.State == runs.RunDone {
		t.Fatalf("the run ended with its client: %+v", run)
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() bool {
		return decode[runs.RunModel](t, mustGet(t, g, "/api/runs/"+cm.ProcessIDs[1])).State == runs.RunDone
	})
	if e := g.run(map[string]any{"code": "y", "context": "ops"}); len(e.Results) != 1 || e.Results[0].Text != "2" {
		t.Errorf("the abandoned run did not finish: %+v", e)
	}
	// Interrupt through the context.
	resp := startStream(t, g, map[string]any{"code": "import time; print('go', flush=True); time.sleep(30)", "context": "ops"})
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	readEvents(t, sc, func(e event) bool { return e.Type == "stdout" })
	if status, body := g.do("POST", "/api/contexts/ops/interrupt", nil); status != 204 {
		t.Fatalf("interrupt: %d %s", status, body)
	}
	evs := readEvents(t, sc, func(e event) bool { return e.Type == "end" })
	if end := evs[len(evs)-1]; end.Process.Reason != runs.Interrupted {
		t.Errorf("end %s", end.Raw)
	}
	// Restart: state gone, id kept.
	status, body := g.do("POST", "/api/contexts/ops/restart", nil)
	if cm := decode[sessions.ContextModel](t, body); status != 200 || cm.ID != "ops" || !cm.Active {
		t.Fatalf("restart: %d %s", status, body)
	}
	if e := g.run(map[string]any{"code": "x", "context": "ops"}); e.Error == nil || e.Error.Name != "NameError" {
		t.Errorf("state after restart: %+v", e)
	}
}

func TestPoolKernelsAreNeverReused(t *testing.T) {
	g := newGateway(t, func(m *sessions.Config, _ *Config) { m.PoolSize = 1 })
	// poolHas waits for the python3 pool to hold a ready kernel, having
	// handed out at least hits. The pool fills once it is first used: each
	// run after the first then takes a pool kernel, however slowly a
	// loaded machine refills it.
	poolHas := func(hits int) {
		t.Helper()
		eventually(t, 60*time.Second, func() bool {
			for _, p := range g.mgr.WarmPools().Stats() {
				if p.Spec == "python3" {
					return p.Ready == 1 && p.Hits >= hits
				}
			}
			return false
		})
	}
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		if i > 0 {
			poolHas(i - 1)
		}
		e := g.run(map[string]any{"code": "import os; os.getpid()", "isolated": true})
		if len(e.Results) != 1 {
			t.Fatalf("results %+v", e)
		}
		if seen[e.Results[0].Text] {
			t.Fatalf("an isolated run reused kernel %s", e.Results[0].Text)
		}
		seen[e.Results[0].Text] = true
		// The run's kernel is gone once it ends.
		eventually(t, 10*time.Second, func() bool {
			for _, k := range g.mgr.Kernels() {
				if strings.HasPrefix(e.Context, "isolated-") && k.PID() > 0 && fmt.Sprint(k.PID()) == e.Results[0].Text {
					return false
				}
			}
			return true
		})
	}
	poolHas(2)
}

func TestFinishedRunsAreKeptBounded(t *testing.T) {
	g := newGateway(t, func(m *sessions.Config, _ *Config) { m.RunsKept = 2 })
	var ids []string
	for i := 0; i < 4; i++ {
		ids = append(ids, g.run(map[string]any{"code": fmt.Sprint(i)}).ID)
	}
	g.run(map[string]any{"code": "'prune'"}) // keeps only ids[3] and this one
	for i, id := range ids {
		status, _ := g.do("GET", "/api/runs/"+id, nil)
		if want := map[bool]int{true: 404, false: 200}[i < 3]; status != want {
			t.Errorf("run %d: %d, want %d", i, status, want)
		}
	}
}

package gateway

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/sysproc"
	"kernelgate/runs"
	"kernelgate/sessions"
)

// wantError checks an error answer of the code-interpreter API: its
// status, the contract's body {"code","message"} and words of the message.
func wantError(t *testing.T, what string, status int, body []byte, wantStatus int, code string, words ...string) {
	t.Helper()
	var e map[string]any
	if err := json.Unmarshal(body, &e); err != nil {
		t.Errorf("%s: %d, body not JSON: %q", what, status, body)
		return
	}
	_, hasReason := e["reason"]
	msg, _ := e["message"].(string)
	if status != wantStatus || e["code"] != code || msg == "" || hasReason || len(e) != 2 {
		t.Errorf("%s: %d %s, want %d with {code: %s, message}", what, status, body, wantStatus, code)
		return
	}
	for _, w := range words {
		if !strings.Contains(msg, w) {
			t.Errorf("%s: message %q does not say %q", what, msg, w)
		}
	}
}

// rawRequest sends a request exactly as given (no header added) and
// returns the response with its body read.
func (g *testGateway) rawRequest(method, path, body string, headers map[string]string) (*http.Response, []byte) {
	g.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, g.url+path, rd)
	if err != nil {
		g.t.Fatal(err)
	}
	for k, v := range headers {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp, out
}

func noPool(m *sessions.Config, _ *Config) { m.PoolSize = 0 }

func TestSharedContextIDsKeepTheirLanguage(t *testing.T) {
	g := newGateway(t, noPool)
	g.do("DELETE", "/api/contexts/code-typescript", nil)
	status, body := g.do("POST", "/api/contexts", map[string]any{"id": "code-typescript", "language": "python"})
	wantError(t, "code-typescript in python", status, body, 400, "BAD_REQUEST", "code-typescript", "typescript")
	status, body = g.do("POST", "/api/contexts", map[string]any{"id": "code-javascript"})
	wantError(t, "code-javascript in the default language", status, body, 400, "BAD_REQUEST", "javascript")
	if status, body := g.do("GET", "/api/contexts/code-typescript", nil); status != 404 {
		t.Errorf("a refused context exists: %d %s", status, body)
	}
	// The id of a language's shared kernel in its own language is its
	// shared kernel, made ahead of its first run.
	status, body = g.do("POST", "/api/contexts", map[string]any{"id": "code-python", "language": "python"})
	if status != 201 {
		t.Fatalf("code-python in python: %d %s", status, body)
	}
	if e := g.run(map[string]any{"code": "1"}); e.Context != "code-python" || e.Language != "python" {
		t.Errorf("default run went to %s (%s)", e.Context, e.Language)
	}
}

func TestLaterCwdLeavesTheSharedKernelWhereItIs(t *testing.T) {
	g := newGateway(t, noPool)
	first := g.run(map[string]any{"code": "import os; os.getcwd()"})
	later := g.run(map[string]any{"code": "import os; os.getcwd()", "cwd": t.TempDir()})
	if len(first.Results) != 1 || len(later.Results) != 1 || first.Results[0].Text != later.Results[0].Text {
		t.Errorf("cwd of the shared kernel moved: %+v then %+v", first.Results, later.Results)
	}
	// The contract's reader learns it where cwd is described.
	doc := mustOpenAPI(t)
	cwd := doc.Components.Schemas["ExecuteRequest"].Value.Properties["cwd"].Value.Description
	if !strings.Contains(cwd, "ignored") || !strings.Contains(cwd, "shared kernel") {
		t.Errorf("the OpenAPI description of cwd does not say a later cwd is ignored: %q", cwd)
	}
}

func TestCodeInterpreterBodiesAreStrict(t *testing.T) {
	g := newGateway(t, noPool)
	if status, body := g.do("POST", "/api/contexts", map[string]any{"id": "strict"}); status != 201 {
		t.Fatalf("context: %d %s", status, body)
	}
	for _, c := range []struct {
		path, body string
		words      []string
	}{
		{"/api/execute", `{"code": "1", "contxt": "strict"}`, []string{`"contxt"`, "context"}},
		{"/api/execute", `{"Code": "1"}`, []string{`"Code"`, "case-sensitive"}},
		{"/api/execute", `{"code": "1", "CONTEXT": "strict"}`, []string{`"CONTEXT"`}},
		{"/api/execute", `{"code": "import time; time.sleep(30)", "timeout_s": 1}`, []string{`"timeout_s"`, "timeout"}},
		{"/api/execute", `["code"]`, []string{"JSON object"}},
		{"/api/execute", `{"code": "print(1)\u0000"}`, []string{"NUL"}},
		{"/api/contexts", `{"Id": "other"}`, []string{`"Id"`}},
		{"/api/contexts/strict/tokens", `{"TTL": 60}`, []string{`"TTL"`}},
	} {
		status, body := g.do("POST", c.path, c.body)
		wantError(t, c.path+" "+c.body, status, body, 400, "BAD_REQUEST", c.words...)
	}
	if status, body := g.do("GET", "/api/contexts/other", nil); status != 404 {
		t.Errorf("a context was made from a refused body: %d %s", status, body)
	}
	// The Jupyter surface reads what Jupyter clients send: fields it does
	// not know, and JSON without a Content-Type.
	resp, body := g.rawRequest("POST", "/api/kernels", `{"name": "python3", "path": "a.ipynb", "type": "notebook", "future": 1}`,
		map[string]string{"Authorization": "token " + g.token})
	if resp.StatusCode != 201 {
		t.Fatalf("Jupyter kernel start with extra fields: %d %s", resp.StatusCode, body)
	}
	k := decode[sessions.KernelModel](t, body)
	status, body := g.do("POST", "/api/sessions", map[string]any{"path": "a.ipynb", "name": "a.ipynb", "type": "notebook",
		"kernel": map[string]any{"id": k.ID, "name": "python3"}, "future": true})
	if status != 201 {
		t.Errorf("Jupyter session with extra fields: %d %s", status, body)
	}
}

func TestCodeInterpreterBodiesNeedJSONContentType(t *testing.T) {
	g := newGateway(t, noPool)
	auth := "token " + g.token
	for _, c := range []struct {
		path, contentType string
	}{
		{"/api/execute", ""},
		{"/api/execute", "text/plain"},
		{"/api/execute", "application/x-www-form-urlencoded"},
		{"/api/contexts", ""},
	} {
		h := map[string]string{"Authorization": auth}
		if c.contentType != "" {
			h["Content-Type"] = c.contentType
		}
		resp, body := g.rawRequest("POST", c.path, `{"code": "1"}`, h)
		wantError(t, c.path+" with Content-Type "+c.contentType, resp.StatusCode, body, 415, "UNSUPPORTED_MEDIA_TYPE", "Content-Type: application/json")
	}
	resp, body := g.rawRequest("POST", "/api/execute", `{"code": "1"}`, map[string]string{"Authorization": auth, "Content-Type": "application/json; charset=utf-8"})
	if resp.StatusCode != 200 {
		t.Errorf("JSON with a charset: %d %s", resp.StatusCode, body)
	}
}

func TestContextIDsAreReachableByURL(t *testing.T) {
	g := newGateway(t, noPool)
	for _, id := range []string{".", "..", ""} {
		status, body := g.do("POST", "/api/contexts", map[string]any{"id": id})
		wantError(t, "context id "+id, status, body, 400, "BAD_REQUEST", "id")
	}
	status, body := g.do("POST", "/api/execute", map[string]any{"code": "1", "context": ""})
	wantError(t, "execute in context \"\"", status, body, 400, "BAD_REQUEST", "context")
	if status, body := g.do("GET", "/api/contexts", nil); status != 200 || strings.TrimSpace(string(body)) != "[]" {
		t.Errorf("contexts made from refused requests: %d %s", status, body)
	}
}

func TestTinyTimeoutsBoundTheRun(t *testing.T) {
	g := newGateway(t, noPool)
	g.run(map[string]any{"code": "kept = 'yes'"})
	for i := range 12 {
		timeout := 0.001 * float64(1+i%9)
		e := g.run(map[string]any{"code": "import time; time.sleep(0.3)", "timeout": timeout})
		// Interrupted (exitCode 1), or timed out before its turn (none).
		if e.Process.Reason != runs.TimedOut || exitCode(e) == "0" || len(e.Results) != 0 {
			t.Errorf("timeout %v: process %+v", timeout, e.Process)
		}
	}
	if e := g.run(map[string]any{"code": "kept"}); len(e.Results) != 1 || e.Results[0].Text != "'yes'" {
		t.Errorf("state after the timeouts: %+v", e)
	}
}

func TestMissingCwdIsABadRequest(t *testing.T) {
	g := newGateway(t, noPool)
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		body map[string]any
	}{
		{"/api/execute", map[string]any{"code": "1", "isolated": true, "cwd": "/no/such/dir"}},
		{"/api/execute", map[string]any{"code": "1", "cwd": "/no/such/dir"}},
		{"/api/execute", map[string]any{"code": "1", "isolated": true, "cwd": file}},
		{"/api/contexts", map[string]any{"id": "nowhere", "cwd": "/no/such/dir"}},
	} {
		status, body := g.do("POST", c.path, c.body)
		wantError(t, c.path+" "+c.body["cwd"].(string), status, body, 400, "BAD_REQUEST", "cwd", c.body["cwd"].(string))
	}
	if ks := decode[[]sessions.KernelModel](t, mustGet(t, g, "/api/kernels")); len(ks) != 0 {
		t.Errorf("kernels started for refused runs: %+v", ks)
	}
}

func TestCodeInterpreterErrorsHaveTheContractShape(t *testing.T) {
	g := newGateway(t, noPool)
	evil := map[string]string{"Authorization": "token " + g.token, "Origin": "http://evil.example", "Content-Type": "application/json"}
	for _, path := range []string{"/api/execute", "/api/contexts", "/api/contexts/x/restart", "/api/runs/x/interrupt"} {
		resp, body := g.rawRequest("POST", path, `{"code": "1"}`, evil)
		wantError(t, "cross-origin POST "+path, resp.StatusCode, body, 403, "FORBIDDEN", "origin")
	}
	// A path of the API with another method, or none of its routes.
	for _, c := range []struct{ method, path string }{{"GET", "/api/execute"}, {"PUT", "/api/contexts"}, {"GET", "/api/runs"}, {"GET", "/api/runs/x/nothing"}} {
		resp, body := g.rawRequest(c.method, c.path, "", map[string]string{"Authorization": "token " + g.token})
		wantError(t, c.method+" "+c.path, resp.StatusCode, body, 404, "NOT_FOUND")
	}
	// The Jupyter surface keeps Jupyter's body.
	resp, body := g.rawRequest("POST", "/api/kernels", `{}`, evil)
	if j := decode[map[string]any](t, body); resp.StatusCode != 403 || j["reason"] == nil || j["code"] != nil {
		t.Errorf("cross-origin POST /api/kernels: %d %s", resp.StatusCode, body)
	}

	// 401 names the scheme to use, on both surfaces.
	for _, c := range []struct{ path, auth, want string }{
		{"/api/contexts", "", `Bearer realm="kernelgate"`},
		{"/api/contexts", "Bearer wrong", `Bearer realm="kernelgate", error="invalid_token"`},
		{"/api/runs/x", "", `Bearer realm="kernelgate"`},
		{"/api/kernels", "", `token realm="kernelgate"`},
		{"/api/kernels", "token wrong", `token realm="kernelgate"`},
	} {
		h := map[string]string{}
		if c.auth != "" {
			h["Authorization"] = c.auth
		}
		resp, body := g.rawRequest("GET", c.path, "", h)
		got := strings.Join(resp.Header.Values("WWW-Authenticate"), " | ")
		if resp.StatusCode != 401 || !strings.Contains(got, c.want) {
			t.Errorf("GET %s with %q: %d, WWW-Authenticate %q, want %q (%s)", c.path, c.auth, resp.StatusCode, got, c.want, body)
		}
	}

	// Without a token, a request naming another host is refused in the
	// shape of its surface too.
	open := newGateway(t, noPool, func(_ *sessions.Config, c *Config) { c.Token = "" })
	resp, body = open.rawRequest("GET", "/api/contexts", "", map[string]string{"Host": "rebound.example"})
	wantError(t, "GET /api/contexts for another host", resp.StatusCode, body, 403, "FORBIDDEN", "localhost")
}

func TestEventsAfterTheEndGiveTheEnd(t *testing.T) {
	g := newGateway(t, noPool)
	e := g.run(map[string]any{"code": "print('hi')"})
	for _, after := range []string{"3", "99"} {
		body := mustGet(t, g, "/api/runs/"+e.ID+"/events?after="+after)
		lines := strings.Split(strings.TrimSpace(string(body)), "\n")
		var end event
		if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &end) != nil || end.Type != "end" || end.Process.Reason != runs.Completed {
			t.Errorf("events after %s of a finished run: %q", after, body)
		}
	}
}

func TestProcessIDsListOnlyKeptRuns(t *testing.T) {
	g := newGateway(t, noPool, func(m *sessions.Config, _ *Config) { m.RunRetention = 200 * time.Millisecond })
	if status, body := g.do("POST", "/api/contexts", map[string]any{"id": "brief"}); status != 201 {
		t.Fatalf("context: %d %s", status, body)
	}
	e := g.run(map[string]any{"code": "1", "context": "brief"})
	eventually(t, 10*time.Second, func() bool {
		status, _ := g.do("GET", "/api/runs/"+e.ID, nil)
		return status == 404
	})
	if cm := decode[sessions.ContextModel](t, mustGet(t, g, "/api/contexts/brief")); len(cm.ProcessIDs) != 0 {
		t.Errorf("processIds %v lists a run that is gone", cm.ProcessIDs)
	}
}

func TestKernelDeathIsLoggedOnce(t *testing.T) {
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	g := newGateway(t, noPool, func(_ *sessions.Config, c *Config) { c.testLogger = log })
	if status, body := g.do("POST", "/api/contexts", map[string]any{"id": "mortal"}); status != 201 {
		t.Fatalf("context: %d %s", status, body)
	}
	cm := decode[sessions.ContextModel](t, mustGet(t, g, "/api/contexts/mortal"))
	if err := sysproc.Kill(*cm.KernelProcessID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The context learns of the death after the process's end is known.
	eventually(t, 30*time.Second, func() bool {
		return !decode[sessions.ContextModel](t, mustGet(t, g, "/api/contexts/mortal")).Active
	})
	if n := strings.Count(logs.String(), "msg=\"kernel died\""); n != 1 {
		t.Errorf("the death is logged %d times:\n%s", n, logs.String())
	}
}

func TestRunsOfADeletedContextSayWhyTheyAreLost(t *testing.T) {
	g := newGateway(t, noPool)
	if status, body := g.do("POST", "/api/contexts", map[string]any{"id": "doomed"}); status != 201 {
		t.Fatalf("context: %d %s", status, body)
	}
	running := startStream(t, g, map[string]any{"code": "import time; print('go', flush=True); time.sleep(30)", "context": "doomed"})
	defer running.Body.Close()
	rsc := bufio.NewScanner(running.Body)
	readEvents(t, rsc, func(e event) bool { return e.Type == "stdout" })
	queued := startStream(t, g, map[string]any{"code": "print('never')", "context": "doomed"})
	defer queued.Body.Close()
	qsc := bufio.NewScanner(queued.Body)
	readEvents(t, qsc, func(e event) bool { return e.Type == "start" })
	if status, body := g.do("DELETE", "/api/contexts/doomed", nil); status != 204 {
		t.Fatalf("delete: %d %s", status, body)
	}
	for name, sc := range map[string]*bufio.Scanner{"running": rsc, "queued": qsc} {
		evs := readEvents(t, sc, func(e event) bool { return e.Type == "end" })
		end := evs[len(evs)-1]
		if end.Type != "end" || end.Process.Reason != runs.Lost || !strings.Contains(end.Process.Message, "deleted") {
			t.Errorf("%s run: %s", name, end.Raw)
		}
	}
}

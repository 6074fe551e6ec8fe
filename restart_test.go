//go:build linux

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/websocket"

	"kernelgate/internal/testkernels"
)

// These tests restart the real binary on the same state directory, with
// real kernels: what a crash, an upgrade or a damaged store leaves.

// restartDirs are the directories a gateway and the next one share.
type restartDirs struct {
	state, runtime string
}

func newRestartDirs(t *testing.T) restartDirs {
	d := restartDirs{state: filepath.Join(t.TempDir(), "state"), runtime: t.TempDir()}
	// Whatever a failing test leaves running is ended (the processes of
	// this test's kernels only: their command lines name its directory).
	t.Cleanup(func() {
		for _, pid := range kernelProcs(d.runtime, true) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return d
}

func (d restartDirs) start(t *testing.T, bin string, args ...string) *gatewayProcess {
	t.Helper()
	return startGateway(t, bin, append([]string{"--state-dir", d.state, "--runtime-dir", d.runtime}, args...)...)
}

// kernelProcs lists the live processes whose command line names a
// kernel's directory in dir: the kernels (and, with watchdogs, their
// watchdogs) of a runtime dir.
func kernelProcs(dir string, watchdogs bool) []int {
	var out []int
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cmd, []byte(dir+"/kernel-")) {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err != nil || strings.Contains(string(st), ") Z ") {
			continue
		}
		if !watchdogs && bytes.Contains(cmd, []byte("kernelgate-watchdog")) {
			continue
		}
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}

// waitProcs waits until the kernel processes of dir are want.
func waitProcs(t *testing.T, dir string, watchdogs bool, want []int) {
	t.Helper()
	slices.Sort(want)
	var got []int
	if !pollUntil(30*time.Second, func() bool {
		got = kernelProcs(dir, watchdogs)
		return slices.Equal(got, want)
	}) {
		t.Fatalf("kernel processes %v, want %v", got, want)
	}
}

// kill ends the gateway with sig and waits for it.
func (p *gatewayProcess) kill(t *testing.T, sig syscall.Signal) error {
	t.Helper()
	p.cmd.Process.Signal(sig)
	select {
	case err := <-p.done:
		return err
	case <-time.After(60 * time.Second):
		p.cmd.Process.Kill()
		t.Fatalf("kernelgate did not exit after %v\n%s", sig, p.logs)
		return nil
	}
}

// call makes a JSON request and decodes the answer into out.
func call(t *testing.T, method, url string, body any, want int, out any) {
	t.Helper()
	callAs(t, "", method, url, body, want, out)
}

// callAs is call with a token.
func callAs(t *testing.T, token, method, url string, body any, want int, out any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "token "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %d %s, want %d", method, url, resp.StatusCode, b, want)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, url, err, b)
		}
	}
}

type ctxModel struct {
	ID              string   `json:"id"`
	KernelID        *string  `json:"kernelId"`
	KernelProcessID *int     `json:"kernelProcessId"`
	ProcessIDs      []string `json:"processIds"`
}

type execution struct {
	Logs struct {
		Stdout []string `json:"stdout"`
		Stderr []string `json:"stderr"`
	} `json:"logs"`
	Results []struct {
		Text string `json:"text"`
	} `json:"results"`
	Error *struct {
		Name string `json:"name"`
	} `json:"error"`
	Process struct {
		Reason  string `json:"reason"`
		Message string `json:"message"`
	} `json:"process"`
}

func (e execution) text() string {
	if len(e.Results) == 0 {
		return ""
	}
	return e.Results[len(e.Results)-1].Text
}

// execute runs code in a context and returns its Execution.
func execute(t *testing.T, url, context, code string) execution {
	t.Helper()
	var e execution
	call(t, "POST", url+"api/execute", map[string]any{"context": context, "code": code}, 200, &e)
	return e
}

type sessionModel struct {
	ID     string `json:"id"`
	Kernel struct {
		ID string `json:"id"`
	} `json:"kernel"`
}

// wsExecute runs code on a kernel through its Jupyter websocket and
// returns the text of its execute_result, once both its reply (shell) and
// its idle status (iopub, where the result comes before it) arrived.
func wsExecute(t *testing.T, url, kernel, code string) string {
	t.Helper()
	ws, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(url, "http")+"api/kernels/"+kernel+"/channels?session_id="+uuid.NewString(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	id := uuid.NewString()
	msg := map[string]any{
		"header":        map[string]any{"msg_id": id, "msg_type": "execute_request", "session": "t", "username": "t", "version": "5.3", "date": time.Now().UTC().Format(time.RFC3339)},
		"parent_header": map[string]any{}, "metadata": map[string]any{}, "channel": "shell",
		"content": map[string]any{"code": code, "silent": false, "store_history": true, "user_expressions": map[string]any{}, "allow_stdin": false},
	}
	if err := ws.WriteJSON(msg); err != nil {
		t.Fatal(err)
	}
	ws.SetReadDeadline(time.Now().Add(60 * time.Second))
	result, replied, idle := "", false, false
	for !replied || !idle {
		var m struct {
			Header struct {
				MsgType string `json:"msg_type"`
			} `json:"header"`
			ParentHeader struct {
				MsgID string `json:"msg_id"`
			} `json:"parent_header"`
			Content json.RawMessage `json:"content"`
		}
		if err := ws.ReadJSON(&m); err != nil {
			t.Fatalf("websocket: %v (result so far %q)", err, result)
		}
		if m.ParentHeader.MsgID != id {
			continue
		}
		switch m.Header.MsgType {
		case "execute_result":
			var c struct {
				Data map[string]string `json:"data"`
			}
			json.Unmarshal(m.Content, &c)
			result = c.Data["text/plain"]
		case "error":
			t.Fatalf("websocket run failed: %s", m.Content)
		case "execute_reply":
			replied = true
		case "status":
			var c struct {
				State string `json:"execution_state"`
			}
			json.Unmarshal(m.Content, &c)
			idle = c.State == "idle"
		}
	}
	return result
}

// streamRun starts a streamed run and returns its id once it has printed
// n lines.
func streamRun(t *testing.T, url, context, code string, n int) string {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"context": context, "code": code})
	req, _ := http.NewRequest("POST", url+"api/execute", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	sc := bufio.NewScanner(resp.Body)
	run, lines := "", 0
	for lines < n && sc.Scan() {
		var ev struct {
			Type, Run string
		}
		json.Unmarshal(sc.Bytes(), &ev)
		switch ev.Type {
		case "start":
			run = ev.Run
		case "stdout":
			lines++
		case "end":
			t.Fatalf("the run ended early: %s", sc.Bytes())
		}
	}
	if run == "" || lines < n {
		t.Fatalf("the streamed run printed %d lines (%v)", lines, sc.Err())
	}
	return run
}

type runEvent struct {
	Type    string `json:"type"`
	Seq     int    `json:"seq"`
	Text    string `json:"text"`
	Process struct {
		Reason string `json:"reason"`
	} `json:"process"`
}

// runEvents reads a run's events after seq until its end.
func runEvents(t *testing.T, url, run string, after int) []runEvent {
	t.Helper()
	req, _ := http.NewRequest("GET", fmt.Sprintf("%sapi/runs/%s/events?after=%d", url, run, after), nil)
	req.Header.Set("Accept", "application/x-ndjson")
	client := &http.Client{Timeout: 60 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("events of run %s: %d %s", run, resp.StatusCode, b)
	}
	var out []runEvent
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev runEvent
		json.Unmarshal(sc.Bytes(), &ev)
		if ev.Type == "keepalive" {
			continue
		}
		out = append(out, ev)
		if ev.Type == "end" {
			return out
		}
	}
	t.Fatalf("events of run %s ended without end: %v", run, sc.Err())
	return nil
}

// TestRestartAfterSIGKILL: a gateway killed while a context has state, a
// Jupyter session is open and a streamed run prints comes back on the same
// state directory with the same kernels (same processes, same state), the
// run picked up to its end, and no kernel duplicated or left behind.
func TestRestartAfterSIGKILL(t *testing.T) {
	bin := buildBinary(t)
	dirs := newRestartDirs(t)
	g := dirs.start(t, bin, "--pool-size", "1", "--pool-prewarm", "python")

	var c ctxModel
	call(t, "POST", g.url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, &c)
	if e := execute(t, g.url, "agent", "x = 41"); e.Process.Reason != "completed" {
		t.Fatalf("setting x: %+v", e)
	}
	// Python kernels are forked from the zygote (the default launcher)
	// with the state directory on too: sys.orig_argv names the zygote.
	forked := "True"
	if os.Getenv(testkernels.ZygoteEnv) == "0" {
		forked = "False"
	}
	if e := execute(t, g.url, "agent", "import sys\nany('kernelgate-zygote' in a for a in sys.orig_argv)"); e.text() != forked {
		t.Fatalf("the context's kernel forked: %+v, want %s", e, forked)
	}
	var s sessionModel
	call(t, "POST", g.url+"api/sessions", map[string]any{"path": "work.ipynb", "type": "notebook", "kernel": map[string]any{"name": "python3"}}, 201, &s)
	notebookPID := wsExecute(t, g.url, s.Kernel.ID, "import os; y = 7; os.getpid()")
	// The notebook stays connected through the crash.
	open, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(g.url, "http")+"api/kernels/"+s.Kernel.ID+"/channels?session_id="+uuid.NewString(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	run := streamRun(t, g.url, "agent", "import time\nfor i in range(40):\n    print(i, flush=True)\n    time.sleep(0.1)\nx + 1", 3)

	// The context's, the notebook's and the warm pool's (refilled once the
	// context took its kernel).
	var before []int
	if !pollUntil(30*time.Second, func() bool { before = kernelProcs(dirs.runtime, false); return len(before) == 3 }) {
		for _, pid := range before {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			t.Logf("%d: %q", pid, b)
		}
		t.Fatalf("kernel processes before the crash: %v, want 3", before)
	}
	g.kill(t, syscall.SIGKILL)

	g2 := dirs.start(t, bin, "--pool-size", "1", "--pool-prewarm", "python")
	var cs []ctxModel
	call(t, "GET", g2.url+"api/contexts", nil, 200, &cs)
	if len(cs) != 1 || cs[0].ID != "agent" || *cs[0].KernelID != *c.KernelID || *cs[0].KernelProcessID != *c.KernelProcessID {
		t.Fatalf("contexts after the restart: %+v, want agent on kernel %s pid %d", cs, *c.KernelID, *c.KernelProcessID)
	}
	var ss []sessionModel
	call(t, "GET", g2.url+"api/sessions", nil, 200, &ss)
	if len(ss) != 1 || ss[0].ID != s.ID || ss[0].Kernel.ID != s.Kernel.ID {
		t.Fatalf("sessions after the restart: %+v, want %+v", ss, s)
	}

	// The old run is picked up and ends; its events resume across the
	// restart and say what was lost.
	evs := runEvents(t, g2.url, run, 1)
	end := evs[len(evs)-1]
	marker := false
	for _, ev := range evs {
		marker = marker || strings.Contains(ev.Text, "no gateway was running")
	}
	if end.Process.Reason != "completed" || !marker || evs[0].Seq != 2 {
		t.Fatalf("events of the old run after the restart: %+v", evs)
	}
	var rm struct {
		State     string    `json:"state"`
		Execution execution `json:"execution"`
	}
	call(t, "GET", g2.url+"api/runs/"+run, nil, 200, &rm)
	if rm.State != "done" || rm.Execution.text() != "42" {
		t.Fatalf("the old run's record: %+v", rm)
	}

	// The state is there, in the same processes.
	if e := execute(t, g2.url, "agent", "import os\n(x, os.getpid())"); e.text() != fmt.Sprintf("(41, %d)", *c.KernelProcessID) {
		t.Fatalf("the context after the restart: %+v", e)
	}
	if got := wsExecute(t, g2.url, s.Kernel.ID, "import os; (y, os.getpid())"); got != fmt.Sprintf("(7, %s)", notebookPID) {
		t.Fatalf("the notebook's kernel after the restart answered %s, want (7, %s)", got, notebookPID)
	}

	// No kernel twice, none left behind: the two kernels kept, the old
	// warm-pool kernel stopped, one new warm-pool kernel.
	waitFor(t, func() bool {
		now := kernelProcs(dirs.runtime, false)
		var pid int
		fmt.Sscan(notebookPID, &pid)
		return len(now) == 3 && slices.Contains(now, *c.KernelProcessID) && slices.Contains(now, pid) &&
			len(slices.DeleteFunc(slices.Clone(before), func(p int) bool { return slices.Contains(now, p) })) == 1
	}, "kernel processes after the restart: want the two kept and a new pool kernel, got %v (before %v)", func() []any {
		return []any{kernelProcs(dirs.runtime, false), before}
	})

	// The default SIGTERM leaves nothing running, watchdogs included.
	if err := g2.kill(t, syscall.SIGTERM); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, g2.logs)
	}
	waitProcs(t, dirs.runtime, true, nil)
}

// waitFor waits until ok holds, failing with the message and its args.
func waitFor(t *testing.T, ok func() bool, msg string, args func() []any) {
	t.Helper()
	if !pollUntil(30*time.Second, ok) {
		t.Fatalf(msg, args()...)
	}
}

// TestRestartAfterKernelKilledWhileDown: a kernel that died while no
// gateway ran is reported as a death: the context's next run says its
// state was lost, the notebook's kernel restarts under its id.
func TestRestartAfterKernelKilledWhileDown(t *testing.T) {
	bin := buildBinary(t)
	dirs := newRestartDirs(t)
	g := dirs.start(t, bin, "--pool-size", "0")
	var c ctxModel
	call(t, "POST", g.url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, &c)
	execute(t, g.url, "agent", "x = 41")
	var s sessionModel
	call(t, "POST", g.url+"api/sessions", map[string]any{"path": "work.ipynb", "type": "notebook", "kernel": map[string]any{"name": "python3"}}, 201, &s)
	var notebookPID int
	fmt.Sscan(wsExecute(t, g.url, s.Kernel.ID, "import os; os.getpid()"), &notebookPID)
	g.kill(t, syscall.SIGKILL)
	for _, pid := range []int{*c.KernelProcessID, notebookPID} {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	waitProcs(t, dirs.runtime, false, nil)

	g2 := dirs.start(t, bin, "--pool-size", "0")
	e := execute(t, g2.url, "agent", "x")
	if e.Error == nil || e.Error.Name != "NameError" || !strings.Contains(e.Process.Message, "without the earlier state") {
		t.Fatalf("the first run after the kernel was lost: %+v", e)
	}
	var cs []ctxModel
	call(t, "GET", g2.url+"api/contexts", nil, 200, &cs)
	if len(cs) != 1 || *cs[0].KernelID != *c.KernelID || *cs[0].KernelProcessID == *c.KernelProcessID {
		t.Fatalf("contexts: %+v", cs)
	}
	var ss []sessionModel
	call(t, "GET", g2.url+"api/sessions", nil, 200, &ss)
	if len(ss) != 1 || ss[0].Kernel.ID != s.Kernel.ID {
		t.Fatalf("sessions: %+v", ss)
	}
	defer func() { t.Log(g2.logs) }()
	if got := wsExecute(t, g2.url, s.Kernel.ID, "1 + 1"); got != "2" {
		t.Fatalf("the notebook's restarted kernel answered %q", got)
	}
	if err := g2.kill(t, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitProcs(t, dirs.runtime, true, nil)
}

// TestKeepKernelsAcrossSIGTERM: --keep-kernels leaves the kernels running
// for the next start, which adopts them; a start without it shuts them
// down at SIGTERM, contexts kept for the next start without their state.
func TestKeepKernelsAcrossSIGTERM(t *testing.T) {
	bin := buildBinary(t)
	dirs := newRestartDirs(t)
	g := dirs.start(t, bin, "--pool-size", "0", "--keep-kernels")
	var c ctxModel
	call(t, "POST", g.url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, &c)
	execute(t, g.url, "agent", "x = 41")
	if err := g.kill(t, syscall.SIGTERM); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, g.logs)
	}
	waitProcs(t, dirs.runtime, false, []int{*c.KernelProcessID})

	g2 := dirs.start(t, bin, "--pool-size", "0")
	if e := execute(t, g2.url, "agent", "import os\n(x, os.getpid())"); e.text() != fmt.Sprintf("(41, %d)", *c.KernelProcessID) {
		t.Fatalf("the context after a --keep-kernels restart: %+v", e)
	}
	if err := g2.kill(t, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitProcs(t, dirs.runtime, true, nil)

	g3 := dirs.start(t, bin, "--pool-size", "0")
	e := execute(t, g3.url, "agent", "x")
	if e.Error == nil || !strings.Contains(e.Process.Message, "without the earlier state") {
		t.Fatalf("the context after a default SIGTERM: %+v", e)
	}
}

// TestRestartWithCorruptStore: a store that is not a database is moved
// aside, the loss is logged, and the gateway serves.
func TestRestartWithCorruptStore(t *testing.T) {
	bin := buildBinary(t)
	dirs := newRestartDirs(t)
	os.MkdirAll(dirs.state, 0o700)
	db := filepath.Join(dirs.state, "kernelgate.db")
	if err := os.WriteFile(db, bytes.Repeat([]byte("not a database "), 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	g := dirs.start(t, bin, "--pool-size", "0")
	var cs []ctxModel
	call(t, "GET", g.url+"api/contexts", nil, 200, &cs)
	if len(cs) != 0 {
		t.Fatalf("contexts from a corrupt store: %+v", cs)
	}
	aside, _ := filepath.Glob(db + ".*.damaged")
	if len(aside) != 1 || !strings.Contains(g.logs.String(), "level=ERROR") {
		t.Fatalf("the corrupt store was not moved aside with an error logged: %v\n%s", aside, g.logs)
	}
	call(t, "POST", g.url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, nil)
	if e := execute(t, g.url, "agent", "1 + 1"); e.text() != "2" {
		t.Fatalf("a run on the new store: %+v", e)
	}
}

// TestContextTokenAfterRestart: a context token minted before a crash
// still runs code in its context after the restart (its hash is kept with
// the context), and only there.
func TestContextTokenAfterRestart(t *testing.T) {
	bin := buildBinary(t)
	dirs := newRestartDirs(t)
	const admin = "restart-admin-token"
	g := dirs.start(t, bin, "--pool-size", "0", "--token", admin)
	callAs(t, admin, "POST", g.url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, nil)
	callAs(t, admin, "POST", g.url+"api/contexts", map[string]any{"id": "other", "language": "python"}, 201, nil)
	var tok struct{ Token string }
	callAs(t, admin, "POST", g.url+"api/contexts/agent/tokens", map[string]any{"ttl": 3600}, 201, &tok)
	g.kill(t, syscall.SIGKILL)

	g2 := dirs.start(t, bin, "--pool-size", "0", "--token", admin)
	var e execution
	callAs(t, tok.Token, "POST", g2.url+"api/execute", map[string]any{"context": "agent", "code": "1 + 1"}, 200, &e)
	if e.text() != "2" {
		t.Fatalf("a run with the context token after the restart: %+v", e)
	}
	callAs(t, tok.Token, "POST", g2.url+"api/execute", map[string]any{"context": "other", "code": "1 + 1"}, 403, nil)
}

// TestRestartDenoContext: a Deno kernel, which answers kernel_info on
// its shell channel only, is adopted with its state too.
func TestRestartDenoContext(t *testing.T) {
	bin := buildBinary(t)
	dirs := newRestartDirs(t)
	g := dirs.start(t, bin, "--pool-size", "0")
	var c ctxModel
	call(t, "POST", g.url+"api/contexts", map[string]any{"id": "js", "language": "javascript"}, 201, &c)
	execute(t, g.url, "js", "globalThis.x = 41")
	g.kill(t, syscall.SIGKILL)

	g2 := dirs.start(t, bin, "--pool-size", "0")
	if e := execute(t, g2.url, "js", "`${x + 1} ${Deno.pid}`"); !strings.Contains(e.text(), fmt.Sprintf("42 %d", *c.KernelProcessID)) {
		t.Fatalf("the Deno context after the restart: %+v", e)
	}
	if err := g2.kill(t, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitProcs(t, dirs.runtime, true, nil)
}

// TestRunEndedWhileDown: a run that ended while no gateway ran is picked
// up at the next start and ends with what its kernel published before the
// crash, its result lost with the rest of that output (the marker says
// so), and its context goes on with its state.
func TestRunEndedWhileDown(t *testing.T) {
	bin := buildBinary(t)
	dirs := newRestartDirs(t)
	g := dirs.start(t, bin, "--pool-size", "0")
	var c ctxModel
	call(t, "POST", g.url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, &c)
	done := filepath.Join(t.TempDir(), "done")
	code := fmt.Sprintf("import time, pathlib\nprint('started', flush=True)\nwhile not pathlib.Path(%q + '.go').exists():\n    time.sleep(0.05)\nx = 41\npathlib.Path(%q).write_text('1')\nx + 1", done, done)
	run := streamRun(t, g.url, "agent", code, 1)
	// Run records are committed in batches, at the latest with the next
	// durable write: this one.
	call(t, "POST", g.url+"api/contexts", map[string]any{"id": "other", "language": "python"}, 201, nil)
	g.kill(t, syscall.SIGKILL)
	// The run goes on and ends while no gateway runs.
	os.WriteFile(done+".go", nil, 0o600)
	waitFor(t, func() bool { _, err := os.Stat(done); return err == nil }, "the run did not end while no gateway ran%s", func() []any { return []any{""} })

	g2 := dirs.start(t, bin, "--pool-size", "0")
	evs := runEvents(t, g2.url, run, 0)
	var texts []string
	for _, ev := range evs {
		texts = append(texts, ev.Text)
	}
	all := strings.Join(texts, "")
	if evs[len(evs)-1].Process.Reason != "completed" || !strings.Contains(all, "started") || !strings.Contains(all, "no gateway was running") {
		t.Fatalf("events of a run that ended while no gateway ran: %+v", evs)
	}
	if e := execute(t, g2.url, "agent", "x"); e.text() != "41" {
		t.Fatalf("the context after the restart: %+v", e)
	}
}

// TestOrphanTimeoutEndsKeptKernels: kernels left by --keep-kernels that no
// gateway adopts end once --orphan-timeout has passed, with their
// watchdogs and directories.
func TestOrphanTimeoutEndsKeptKernels(t *testing.T) {
	bin := buildBinary(t)
	dirs := newRestartDirs(t)
	g := dirs.start(t, bin, "--pool-size", "0", "--keep-kernels", "--orphan-timeout", "10s")
	var c ctxModel
	call(t, "POST", g.url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, &c)
	if err := g.kill(t, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitProcs(t, dirs.runtime, false, []int{*c.KernelProcessID})
	// Lease 10 s, a check every 2.5 s, 5 s of grace after SIGTERM.
	if !pollUntil(40*time.Second, func() bool { return len(kernelProcs(dirs.runtime, true)) == 0 }) {
		t.Fatalf("kept kernel processes %v outlived the orphan timeout", kernelProcs(dirs.runtime, true))
	}
	if left, _ := filepath.Glob(filepath.Join(dirs.runtime, "kernel-*")); len(left) > 0 {
		t.Fatalf("kernel directories left: %v", left)
	}
}

// e2bSandbox is a sandbox as the E2B sandbox API answers.
type e2bSandbox struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
	EndAt           string `json:"endAt"`
}

// e2bDo sends an E2B request (X-API-KEY for the sandbox API, the
// sandbox's headers for the rest) and returns status and body.
func e2bDo(t *testing.T, method, url string, body any, headers map[string]string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

var e2bKey = map[string]string{"X-API-KEY": "any-key-0123456789"}

// e2bRun runs code in the sandbox's Python context as the E2B SDK does
// and returns the text of its result and the name of its error.
func e2bRun(t *testing.T, url string, sb e2bSandbox, code string) (text, errName string) {
	t.Helper()
	status, out := e2bDo(t, "POST", url+"e2b/execute", map[string]any{"code": code},
		map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": sb.EnvdAccessToken})
	if status != http.StatusOK {
		t.Fatalf("execute in sandbox %s: %d %s", sb.SandboxID, status, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		var ev struct{ Type, Text, Name string }
		json.Unmarshal([]byte(line), &ev)
		switch ev.Type {
		case "result":
			text = ev.Text
		case "error":
			errName = ev.Name
		}
	}
	return text, errName
}

// sandboxStatus is the status of GET /e2b/v2/sandboxes/{id}.
func sandboxStatus(t *testing.T, url, id string) int {
	t.Helper()
	status, _ := e2bDo(t, "GET", url+"e2b/v2/sandboxes/"+id, nil, e2bKey)
	return status
}

// TestE2BSandboxAfterRestart: an E2B sandbox outlives a SIGKILL of the
// gateway: the next start on the same state directory lists it under its
// id, the access token of its create still opens it and its variables are
// there, in the same kernel process. A timeout set before the crash still
// ends a sandbox after the restart, its context and kernel with it. A
// default SIGTERM keeps the sandbox (its kernel stops, as a context's); a
// kill deletes it for good.
func TestE2BSandboxAfterRestart(t *testing.T) {
	bin := buildBinary(t)
	dirs := newRestartDirs(t)
	g := dirs.start(t, bin, "--pool-size", "0")
	create := func(url string) e2bSandbox {
		t.Helper()
		status, out := e2bDo(t, "POST", url+"e2b/v2/sandboxes", map[string]any{"timeout": 600}, e2bKey)
		var sb e2bSandbox
		if status != http.StatusCreated || json.Unmarshal(out, &sb) != nil || sb.EnvdAccessToken == "" {
			t.Fatalf("create sandbox: %d %s", status, out)
		}
		return sb
	}
	a := create(g.url)
	pidText, errName := e2bRun(t, g.url, a, "import os\nx = 41\nos.getpid()")
	var pid int
	if _, err := fmt.Sscan(pidText, &pid); err != nil || errName != "" {
		t.Fatalf("setting x in sandbox %s: %q %s", a.SandboxID, pidText, errName)
	}
	b := create(g.url)
	var bContexts []ctxModel
	call(t, "GET", g.url+"api/contexts", nil, 200, &bContexts)
	bContexts = slices.DeleteFunc(bContexts, func(c ctxModel) bool { return !strings.HasPrefix(c.ID, "e2b-"+b.SandboxID+"-") })
	if len(bContexts) != 1 || bContexts[0].KernelProcessID == nil {
		t.Fatalf("contexts of sandbox %s: %+v", b.SandboxID, bContexts)
	}
	// b's timeout, set last before the crash, runs out after the restart.
	if status, out := e2bDo(t, "POST", g.url+"e2b/v2/sandboxes/"+b.SandboxID+"/timeout", map[string]any{"timeout": 20}, e2bKey); status != http.StatusNoContent {
		t.Fatalf("set timeout: %d %s", status, out)
	}
	g.kill(t, syscall.SIGKILL)

	g2 := dirs.start(t, bin, "--pool-size", "0")
	var listed []e2bSandbox
	status, out := e2bDo(t, "GET", g2.url+"e2b/v2/sandboxes", nil, e2bKey)
	json.Unmarshal(out, &listed)
	ids := map[string]string{}
	for _, sb := range listed {
		ids[sb.SandboxID] = sb.EndAt
	}
	if status != http.StatusOK || len(listed) != 2 || ids[a.SandboxID] != a.EndAt || ids[b.SandboxID] == "" {
		t.Fatalf("sandboxes after the restart: %d %s, want %s (ends %s) and %s\n%s", status, out, a.SandboxID, a.EndAt, b.SandboxID, g2.logs)
	}
	if text, errName := e2bRun(t, g2.url, a, "(x + 1, os.getpid())"); text != fmt.Sprintf("(42, %d)", pid) {
		t.Fatalf("sandbox %s after the restart: %q %s, want (42, %d)", a.SandboxID, text, errName, pid)
	}
	// b's timeout ends it, with its context and kernel; a's kernel stays.
	waitFor(t, func() bool { return sandboxStatus(t, g2.url, b.SandboxID) == http.StatusNotFound },
		"sandbox %s still there after its timeout", func() []any { return []any{b.SandboxID} })
	var cs []ctxModel
	waitFor(t, func() bool {
		call(t, "GET", g2.url+"api/contexts", nil, 200, &cs)
		return len(cs) == 1 && strings.HasPrefix(cs[0].ID, "e2b-"+a.SandboxID+"-")
	}, "contexts after sandbox %s timed out: %+v", func() []any { return []any{b.SandboxID, cs} })
	waitProcs(t, dirs.runtime, false, []int{pid})

	// The default SIGTERM keeps the sandbox, not its kernel.
	if err := g2.kill(t, syscall.SIGTERM); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, g2.logs)
	}
	waitProcs(t, dirs.runtime, true, nil)
	g3 := dirs.start(t, bin, "--pool-size", "0")
	if _, errName := e2bRun(t, g3.url, a, "x"); errName != "NameError" {
		t.Fatalf("sandbox %s after a default SIGTERM: error %q, want NameError (a new kernel)", a.SandboxID, errName)
	}
	if status, out := e2bDo(t, "DELETE", g3.url+"e2b/v2/sandboxes/"+a.SandboxID, nil, e2bKey); status != http.StatusNoContent {
		t.Fatalf("kill: %d %s", status, out)
	}
	g3.kill(t, syscall.SIGKILL)

	g4 := dirs.start(t, bin, "--pool-size", "0")
	if status := sandboxStatus(t, g4.url, a.SandboxID); status != http.StatusNotFound {
		t.Fatalf("a killed sandbox after a restart: %d", status)
	}
	call(t, "GET", g4.url+"api/contexts", nil, 200, &cs)
	if len(cs) != 0 {
		t.Fatalf("contexts after the sandbox was killed: %+v", cs)
	}
	if err := g4.kill(t, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitProcs(t, dirs.runtime, true, nil)
}

// TestKernelStartingAtCrashIsRemoved: a gateway killed while a kernel it
// launched is still starting (running, not yet recorded in the store)
// leaves a process with a lease that no gateway will adopt; the next start
// on the same state directory removes it at once rather than after the
// orphan timeout.
func TestKernelStartingAtCrashIsRemoved(t *testing.T) {
	bin := buildBinary(t)
	dirs := newRestartDirs(t)
	specs := t.TempDir()
	os.MkdirAll(filepath.Join(specs, "slowpy"), 0o755)
	os.WriteFile(filepath.Join(specs, "slowpy", "kernel.json"), []byte(`{"argv":["/bin/sh","-c","sleep 5; exec /usr/bin/python3 -m ipykernel_launcher -f \"$0\"","{connection_file}"],"display_name":"slow","language":"python"}`), 0o644)
	g := dirs.start(t, bin, "--pool-size", "0", "--kernelspec-dir", specs)
	started := make(chan error, 1)
	go func() {
		b, _ := json.Marshal(map[string]any{"name": "slowpy"})
		resp, err := http.Post(g.url+"api/kernels", "application/json", bytes.NewReader(b))
		if err == nil {
			resp.Body.Close()
		}
		started <- err
	}()
	var starting []int
	if !pollUntil(30*time.Second, func() bool { starting = kernelProcs(dirs.runtime, false); return len(starting) == 1 }) {
		t.Fatalf("the starting kernel's process: %v", starting)
	}
	g.kill(t, syscall.SIGKILL)
	<-started
	if syscall.Kill(starting[0], 0) != nil {
		t.Fatal("the starting kernel died with its gateway: nothing to remove")
	}

	g2 := dirs.start(t, bin, "--pool-size", "0", "--kernelspec-dir", specs)
	var ks []map[string]any
	call(t, "GET", g2.url+"api/kernels", nil, 200, &ks)
	if len(ks) != 0 {
		t.Fatalf("kernels after the restart: %v, want none", ks)
	}
	waitProcs(t, dirs.runtime, true, nil)
	if left, _ := filepath.Glob(filepath.Join(dirs.runtime, "kernel-*")); len(left) > 0 {
		t.Fatalf("kernel directories left: %v", left)
	}
}

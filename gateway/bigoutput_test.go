package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"kernelgate/internal/needs"
	"kernelgate/jupyter"
	"kernelgate/runs"
	"kernelgate/sessions"
)

// eventTexts reads a run's ndjson events to its end and returns the text of
// its stdout and stderr events and the end event.
func eventTexts(t *testing.T, sc *bufio.Scanner) (stdout, stderr string, end event) {
	t.Helper()
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	var out, errs strings.Builder
	for _, e := range readEvents(t, sc, func(e event) bool { return e.Type == "end" }) {
		switch e.Type {
		case "stdout":
			out.WriteString(e.Text)
		case "stderr":
			errs.WriteString(e.Text)
		case "end":
			end = e
		}
	}
	if end.Type != "end" {
		t.Fatal("the event stream ended without its end event")
	}
	return out.String(), errs.String(), end
}

// markerCount finds the truncation marker in text and returns the bytes it
// says were dropped and where it is; -1 when there is none.
func markerCount(t *testing.T, text string) (dropped, at int) {
	t.Helper()
	const prefix = "\n[kernelgate] output truncated: "
	at = strings.Index(text, prefix)
	if at < 0 {
		return 0, -1
	}
	rest := text[at+len(prefix):]
	n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ' ')])
	if err != nil {
		t.Fatalf("marker %q", rest[:40])
	}
	return n, at
}

// Long output keeps its head and its tail, with the marker between them
// saying how many bytes were dropped; the Execution, the live event stream
// and the replayed events say the same, and so does the websocket replay.
func TestLongOutputKeepsHeadAndTail(t *testing.T) {
	const logLimit = 64 << 10
	g := newGateway(t, func(m *sessions.Config, _ *Config) {
		m.RunLimits = runs.Limits{LogBytes: logLimit, ResultBytes: 1 << 20}
		m.ReplayMessages = 100
	})
	line := func(i int) string { return fmt.Sprintf("line %05d %s\n", i, strings.Repeat("x", 100)) }
	const lines = 3000
	code := "import sys\nfor i in range(3000): print(f'line {i:05d} ' + 'x' * 100, flush=True)\n" +
		"print('the error is at the end', file=sys.stderr)"

	resp := startStream(t, g, map[string]any{"code": code})
	defer resp.Body.Close()
	live, liveErr, end := eventTexts(t, bufio.NewScanner(resp.Body))
	if !end.Truncated || end.Process.Reason != runs.Completed {
		t.Fatalf("end %s", end.Raw)
	}
	dropped, at := markerCount(t, live)
	if at < 0 {
		t.Fatalf("no marker in the output: %q", live[:200])
	}
	kept := len(live) - len(jupyter.TruncationMarker(int64(dropped)))
	if !strings.HasPrefix(live, line(0)) || !strings.HasSuffix(live, line(lines-1)) {
		t.Errorf("stdout does not keep its head and tail: %q … %q", live[:30], live[len(live)-30:])
	}
	if at < logLimit/4 || at > logLimit/2+200 {
		t.Errorf("marker at %d, want it after the head (half of %d)", at, logLimit)
	}
	if kept+len(liveErr) > logLimit || kept+dropped != lines*len(line(0)) {
		t.Errorf("kept %d + dropped %d, want %d printed within %d", kept, dropped, lines*len(line(0)), logLimit)
	}
	if liveErr != "the error is at the end\n" {
		t.Errorf("stderr %q", liveErr)
	}

	// The run record and its replayed events say the same.
	var ids []string
	_, body := g.do("GET", "/api/contexts/code-python", nil)
	decodeInto(t, body, &struct {
		ProcessIDs *[]string `json:"processIds"`
	}{&ids})
	id := ids[len(ids)-1]
	_, body = g.do("GET", "/api/runs/"+id, nil)
	var rec struct {
		Execution runs.Execution `json:"execution"`
	}
	decodeInto(t, body, &rec)
	if got := strings.Join(rec.Execution.Logs.Stdout, ""); got != live {
		t.Errorf("the Execution's stdout differs from the event stream's (%d and %d bytes)", len(got), len(live))
	}
	if got := strings.Join(rec.Execution.Logs.Stderr, ""); got != liveErr {
		t.Errorf("the Execution's stderr %q", got)
	}
	req, _ := http.NewRequest("GET", g.url+"/api/runs/"+id+"/events?after=0", nil)
	req.Header.Set("Authorization", "token "+g.token)
	req.Header.Set("Accept", "application/x-ndjson")
	replay, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer replay.Body.Close()
	if out, errs, _ := eventTexts(t, bufio.NewScanner(replay.Body)); out != live || errs != liveErr {
		t.Errorf("replayed events differ from the live ones (%d and %d bytes)", len(out), len(live))
	}

	// The websocket replay: output made while no client is connected
	// keeps its first and its last messages, the marker between them.
	k := g.startKernel("python3")
	c := g.mustDial(k.ID, true)
	gate := filepath.Join(t.TempDir(), "go")
	c.execute("import os, time\nwhile not os.path.exists("+strconv.Quote(gate)+"): time.sleep(0.01)\n"+
		"for i in range(3000): print(f'line {i:05d} ' + 'x' * 100, flush=True)", false)
	c.until(30*time.Second, func(m wsMsg) bool { return m.Header.MsgType == jupyter.ExecuteInput })
	c.conn.Close()
	waitKernel(t, g, k.ID, func(m sessions.KernelModel) bool { return m.Connections == 0 })
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitKernel(t, g, k.ID, func(m sessions.KernelModel) bool { return m.ExecutionState == "idle" })
	c = g.mustDial(k.ID, true)
	var texts []string
	for _, m := range c.until(30*time.Second, func(m wsMsg) bool { return m.state() == "idle" }) {
		if m.Header.MsgType == jupyter.StreamMsg {
			texts = append(texts, m.text(t))
		}
	}
	marker := -1
	for i, s := range texts {
		if strings.Contains(s, "output messages") && strings.Contains(s, "were dropped here") {
			marker = i
		}
	}
	if marker <= 0 || marker == len(texts)-1 || texts[0] != line(0) || texts[len(texts)-1] != line(lines-1) {
		t.Fatalf("replay of %d stream messages: first %q, marker at %d, last %q", len(texts), texts[0], marker, texts[len(texts)-1])
	}
}

// waitKernel polls the kernel's model until ok holds.
func waitKernel(t *testing.T, g *testGateway, id string, ok func(sessions.KernelModel) bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, body := g.do("GET", "/api/kernels/"+id, nil)
		var m sessions.KernelModel
		decodeInto(t, body, &m)
		if ok(m) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kernel %s: %s", id, body)
		}
		<-time.After(20 * time.Millisecond) // poll: the model has no change feed
	}
}

// A websocket client sees an oversized print cut to its head and tail with
// the marker, and the kernel keeps its state.
func TestWebsocketGetsOversizedOutputCut(t *testing.T) {
	g := newGateway(t)
	k := g.startKernel("python3")
	c := g.mustDial(k.ID, true)
	c.run("survivor = 'kept'")
	_, iopub := c.run("for i in range(300): print(('%03d' % i) + 'y' * 1_000_000)\nprint('end of output')")
	var text strings.Builder
	for _, m := range iopub {
		if m.Header.MsgType == jupyter.StreamMsg {
			s := m.text(t)
			if len(s) > 8<<20+200 {
				t.Fatalf("a stream message of %d bytes reached the client; the limit is 8 MiB", len(s))
			}
			text.WriteString(s)
		}
	}
	got := text.String()
	// ipykernel warns on its own output when its I/O thread took over 10 s
	// to send what was printed (a loaded machine): not the gateway's text.
	for strings.HasSuffix(got, "\nIOStream.flush timed out\n") {
		got = strings.TrimSuffix(got, "IOStream.flush timed out\n")
	}
	if !strings.HasPrefix(got, "000yyy") || !strings.HasSuffix(got, "yyy\nend of output\n") || !strings.Contains(got, "[kernelgate] output truncated: ") {
		t.Fatalf("client saw %d bytes: %.20q … %q", len(got), got, got[max(0, len(got)-30):])
	}
	if _, iopub := c.run("print(survivor)"); !strings.Contains(streamOf(t, iopub), "kept") {
		t.Fatal("the kernel lost its state")
	}
}

func streamOf(t *testing.T, iopub []wsMsg) string {
	var b strings.Builder
	for _, m := range iopub {
		if m.Header.MsgType == jupyter.StreamMsg {
			b.WriteString(m.text(t))
		}
	}
	return b.String()
}

// A gigabyte of output, printed as flushed lines, unflushed prints, one
// write, or a message of many frames, leaves the kernel and its state, the
// run completed and truncated, and the gateway's memory within its limits.
func TestGigabyteOfOutputKeepsKernelAndMemory(t *testing.T) {
	g := newGateway(t)
	cfg := sessions.DefaultConfig()
	limits := int64(max(cfg.RunLimits.LogBytes, cfg.ReplayBytes) + cfg.RunLimits.LogBytes + cfg.ReplayBytes)
	const slack = 64 << 20
	g.run(map[string]any{"code": "survivor = 1234"})
	cases := []struct{ name, code string }{
		{"flushed lines", "line = 'y' * (1 << 20)\nfor i in range(1024): print(line, flush=True)"},
		{"unflushed prints", "for i in range(1024): print('y' * (1 << 20))"},
		{"one write", "import sys\nsys.stdout.write('y' * (1 << 30))"},
		{"many frames", "k = get_ipython().kernel\n" +
			"k.session.send(k.iopub_socket, 'display_data', {'data': {'text/plain': 'frames'}, 'metadata': {}}, parent=k.get_parent(), buffers=[b'y' * (1 << 20)] * 1024)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			runtime.GC()
			before := rssBytes(t)
			resetPeakRSS(t)
			// The client shares the gateway's process: it reads only how
			// the run ended, not its megabytes of output.
			status, out := g.do("POST", "/api/execute", map[string]any{"code": c.code})
			peak := peakRSS(t) - before
			if status != 200 {
				t.Fatalf("POST /api/execute: %d %.200s", status, out)
			}
			var e struct {
				Process   runs.ProcessState
				Truncated bool
			}
			if err := json.Unmarshal(out, &e); err != nil {
				t.Fatal(err)
			}
			if e.Process.Reason != runs.Completed || !e.Truncated {
				t.Fatalf("run ended %+v, truncated %v; want completed and truncated", e.Process, e.Truncated)
			}
			t.Logf("gateway peak RSS growth %d MiB", peak>>20)
			if peak > limits+slack {
				t.Errorf("gateway RSS grew by %d MiB at its peak, want under %d MiB (%d MiB of limits + 64)", peak>>20, (limits+slack)>>20, limits>>20)
			}
		})
	}
	e := g.run(map[string]any{"code": "print(survivor)"})
	if strings.Join(e.Logs.Stdout, "") != "1234\n" {
		t.Fatalf("the kernel lost its state: %+v", e)
	}
}

// resetPeakRSS resets this process's peak resident memory (VmHWM).
func resetPeakRSS(t *testing.T) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		needs.Skip(t, "cannot reset the peak RSS: %v", err)
	}
}

// peakRSS is this process's peak resident memory since resetPeakRSS.
func peakRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

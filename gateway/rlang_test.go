package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"kernelgate/internal/needs"
	"kernelgate/internal/testkernels"
	"kernelgate/jupyter"
	"kernelgate/runs"
	"kernelgate/sessions"
)

// needR skips (or, with KERNELGATE_REQUIRE_ALL=1, fails) a test when
// `make kernels` has not written the ir kernelspec (R and IRkernel).
func needR(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(testkernels.Dir(t), "ir", "kernel.json")); err != nil {
		needs.Skip(t, "no ir kernelspec (R with IRkernel): run make kernels (%v)", err)
	}
}

// contextKernel is what a Context says of its kernel.
type contextKernel struct {
	Language   string `json:"language"`
	Kernelspec string `json:"kernelspec"`
	Active     bool   `json:"active"`
}

// mainResults returns the results a run marked as its main result.
func mainResults(e runs.Execution) []*runs.Result {
	var out []*runs.Result
	for _, r := range e.Results {
		if r.IsMainResult {
			out = append(out, r)
		}
	}
	return out
}

// TestRLanguage: language "r" runs on IRkernel and its output is
// translated as Python's is: the value as the main result, print and cat
// on stdout, message and warning on stderr, plots as PNG (SVG when the
// code asks), data frames as HTML and text, errors as the Execution's
// error; the shared kernel keeps state, and GET /api/languages serves r.
func TestRLanguage(t *testing.T) {
	needR(t)
	g := newGateway(t)

	t.Run("value, stdout and stderr", func(t *testing.T) {
		e := g.run(map[string]any{"language": "r", "code": `sales <- c(120, 95)
print("hello")
cat("from cat\n")
message("a note")
warning("careful")
sum(sales)`})
		if e.Language != "r" || e.Context != "code-r" || e.Error != nil || exitCode(e) != "0" {
			t.Fatalf("execution %+v", e)
		}
		main := mainResults(e)
		if len(main) != 1 || main[0].Text != "[1] 215" {
			t.Errorf("main results %+v", e.Results)
		}
		if out := stdoutOf(e); !strings.Contains(out, `[1] "hello"`) || !strings.Contains(out, "from cat\n") {
			t.Errorf("stdout %q", e.Logs.Stdout)
		}
		if errs := strings.Join(e.Logs.Stderr, ""); !strings.Contains(errs, "a note") || !strings.Contains(errs, "careful") {
			t.Errorf("stderr %q", e.Logs.Stderr)
		}
		// The shared kernel keeps state.
		if e := g.run(map[string]any{"language": "r", "code": "sales[2]"}); len(mainResults(e)) != 1 || mainResults(e)[0].Text != "[1] 95" {
			t.Errorf("state: %+v", e.Results)
		}
		// An invisible value is no result.
		if e := g.run(map[string]any{"language": "r", "code": "x <- 1"}); len(e.Results) != 0 {
			t.Errorf("assignment gave results %+v", e.Results)
		}
	})

	t.Run("plot", func(t *testing.T) {
		e := g.run(map[string]any{"language": "r", "code": "plot(1:10)"})
		if len(e.Results) != 1 || e.Results[0].IsMainResult || !strings.HasPrefix(e.Results[0].PNG, "iVBORw0KGgo") {
			t.Fatalf("plot results %+v", e.Results)
		}
		e = g.run(map[string]any{"language": "r", "code": "options(jupyter.plot_mimetypes = c('text/plain', 'image/svg+xml'))\nplot(1:3)"})
		if len(e.Results) != 1 || e.Results[0].IsMainResult || !strings.Contains(e.Results[0].SVG, "<svg") || e.Results[0].PNG != "" {
			t.Fatalf("svg plot results %+v", e.Results)
		}
	})

	t.Run("data frame", func(t *testing.T) {
		e := g.run(map[string]any{"language": "r", "code": `data.frame(region = c("north", "south"), sales = c(10, 32))`})
		main := mainResults(e)
		if len(main) != 1 || !strings.Contains(main[0].HTML, "<table") || !strings.Contains(main[0].HTML, "north") ||
			!strings.Contains(main[0].Text, "south") || !strings.Contains(main[0].Text, "32") {
			t.Fatalf("data frame results %+v", e.Results)
		}
	})

	t.Run("error", func(t *testing.T) {
		e := g.run(map[string]any{"language": "r", "code": `cat("before\n"); stop("boom")`})
		if e.Error == nil || !strings.Contains(e.Error.Value, "boom") || e.Error.Message != e.Error.Value ||
			e.Process.Reason != runs.Errored || exitCode(e) != "1" || stdoutOf(e) != "before\n" {
			t.Fatalf("execution %+v (error %+v)", e, e.Error)
		}
	})

	t.Run("languages", func(t *testing.T) {
		status, out := g.do("GET", "/api/languages", nil)
		if status != 200 {
			t.Fatalf("%d %s", status, out)
		}
		for _, l := range decode[[]sessions.LanguageInfo](t, out) {
			if l.Language == "r" {
				if l.Kernelspec != "ir" || l.Version == nil || !strings.HasPrefix(*l.Version, "4.") {
					t.Errorf("r: %s", out)
				}
				return
			}
		}
		t.Errorf("no r in %s", out)
	})
}

// TestRContextsAndIsolatedRuns: an R context keeps state across runs and
// after a timeout and an interrupt; isolated runs start without it, in
// their cwd and env, from a fresh kernel or the warm pool.
func TestRContextsAndIsolatedRuns(t *testing.T) {
	needR(t)
	g := newGateway(t, func(m *sessions.Config, _ *Config) { m.PoolSize = 1 })
	status, body := g.do("POST", "/api/contexts", map[string]any{"id": "stats", "language": "r", "env": map[string]string{"REGION": "east"}})
	if status != 201 {
		t.Fatalf("create: %d %s", status, body)
	}
	if cm := decode[contextKernel](t, body); cm.Language != "r" || cm.Kernelspec != "ir" || !cm.Active {
		t.Fatalf("context %s", body)
	}
	g.run(map[string]any{"context": "stats", "code": "kept <- 41"})
	if e := g.run(map[string]any{"context": "stats", "code": `paste(Sys.getenv("REGION"), kept + 1)`}); len(mainResults(e)) != 1 || mainResults(e)[0].Text != `[1] "east 42"` {
		t.Fatalf("state: %+v", e.Results)
	}
	if status, body := g.do("POST", "/api/execute", map[string]any{"context": "stats", "language": "python", "code": "1"}); status != 400 {
		t.Errorf("python on an R context: %d %s", status, body)
	}

	t.Run("timeout keeps state", func(t *testing.T) {
		t0 := time.Now()
		e := g.run(map[string]any{"context": "stats", "code": "Sys.sleep(60)", "timeout": 1})
		if e.Process.Reason != runs.TimedOut || exitCode(e) != "1" {
			t.Fatalf("timed out run: %+v", e)
		}
		if took := time.Since(t0); took > 30*time.Second {
			t.Errorf("the timeout took %v", took)
		}
		if e := g.run(map[string]any{"context": "stats", "code": "kept"}); len(mainResults(e)) != 1 || mainResults(e)[0].Text != "[1] 41" {
			t.Errorf("state after the timeout: %+v", e)
		}
	})

	t.Run("a timeout before the code begins keeps state", func(t *testing.T) {
		// The interrupt comes with the execute_input, before IRkernel's
		// handler of interrupts is in place.
		for i := 0; i < 3; i++ {
			e := g.run(map[string]any{"context": "stats", "code": "Sys.sleep(60)", "timeout": 0.001})
			if e.Process.Reason != runs.TimedOut {
				t.Fatalf("run %d: %+v", i, e)
			}
			if e := g.run(map[string]any{"context": "stats", "code": "kept"}); len(mainResults(e)) != 1 || mainResults(e)[0].Text != "[1] 41" {
				t.Fatalf("state after run %d: %+v", i, e)
			}
		}
	})

	t.Run("interrupt keeps state", func(t *testing.T) {
		resp := startStream(t, g, map[string]any{"context": "stats", "code": "cat('go\\n'); Sys.sleep(60)"})
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		evs := readEvents(t, sc, func(e event) bool { return e.Type == "stdout" })
		if status, _ := g.do("POST", "/api/runs/"+evs[0].Run+"/interrupt", nil); status != 204 {
			t.Fatalf("interrupt: %d", status)
		}
		evs = readEvents(t, sc, func(e event) bool { return e.Type == "end" })
		if end := evs[len(evs)-1]; end.Process.Reason != runs.Interrupted || end.Process.ExitCode == nil || *end.Process.ExitCode != 1 {
			t.Fatalf("end %s", end.Raw)
		}
		if e := g.run(map[string]any{"context": "stats", "code": "kept"}); len(mainResults(e)) != 1 || mainResults(e)[0].Text != "[1] 41" {
			t.Errorf("state after the interrupt: %+v", e)
		}
	})

	t.Run("isolated", func(t *testing.T) {
		// On a gateway of its own, where no R context has made the pool
		// of ir yet (contexts take pooled kernels too): the first
		// isolated run starts a kernel, and the pool of ir fills; the
		// second takes the pooled kernel and gets its cwd and env by code.
		g := newGateway(t, func(m *sessions.Config, _ *Config) { m.PoolSize = 1 })
		for i, want := range []int{0, 1} {
			if i > 0 {
				eventually(t, 60*time.Second, func() bool {
					for _, p := range g.mgr.WarmPools().Stats() {
						if p.Spec == "ir" {
							return p.Ready == 1
						}
					}
					return false
				})
			}
			e := g.run(map[string]any{"language": "r", "isolated": true, "cwd": "sub dir", "env": map[string]string{"KG_R": `it's "quoted"`},
				"code": `c(exists("kept"), basename(getwd()) == "sub dir", Sys.getenv("KG_R") == "it's \"quoted\"")`})
			if len(mainResults(e)) != 1 || mainResults(e)[0].Text != "[1] FALSE  TRUE  TRUE" || !strings.HasPrefix(e.Context, "isolated-") {
				t.Fatalf("isolated run %d: %+v %+v", i, e, e.Error)
			}
			hits := -1
			for _, p := range g.mgr.WarmPools().Stats() {
				if p.Spec == "ir" {
					hits = p.Hits
				}
			}
			if hits != want {
				t.Errorf("isolated run %d: pool hits %d, want %d", i, hits, want)
			}
		}
	})
}

// TestKernelspecByName: "kernelspec" stands instead of (or beside)
// "language" on execute, isolated runs and context create, for the
// kernelspecs of the language table (the run is that language's) and for
// any other installed one (its own shared kernel, kernelspec-<name>).
func TestKernelspecByName(t *testing.T) {
	needR(t)
	// A site's own kernelspec: IRkernel again, under another name that no
	// language of the table names; Python is served only by name.
	site := t.TempDir()
	b, err := os.ReadFile(filepath.Join(testkernels.Dir(t), "ir", "kernel.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(site, "r-site"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(site, "r-site", "kernel.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	g := newGatewayWithDirs(t, []string{site}, func(m *sessions.Config, _ *Config) {
		m.Languages = map[string]string{"r": "ir", "javascript": "deno"}
	})

	e := g.run(map[string]any{"kernelspec": "ir", "code": "1 + 1"})
	if e.Language != "r" || e.Context != "code-r" || len(mainResults(e)) != 1 || mainResults(e)[0].Text != "[1] 2" {
		t.Fatalf("kernelspec ir: %+v", e)
	}
	// Beside language, the same shared kernel.
	g.run(map[string]any{"kernelspec": "ir", "language": "r", "code": "shared_r <- 'same'"})
	if e := g.run(map[string]any{"language": "r", "code": "shared_r"}); len(mainResults(e)) != 1 || mainResults(e)[0].Text != `[1] "same"` {
		t.Errorf("kernelspec ir and language r on one kernel: %+v", e.Results)
	}

	e = g.run(map[string]any{"kernelspec": "r-site", "code": "exists('shared_r')"})
	if e.Language != "r" || e.Context != "kernelspec-r-site" || len(mainResults(e)) != 1 || mainResults(e)[0].Text != "[1] FALSE" {
		t.Fatalf("kernelspec r-site: %+v", e)
	}
	// A kernelspec of another language, outside the table.
	e = g.run(map[string]any{"kernelspec": "python3", "code": "import sys; sys.version_info[0]"})
	if e.Language != "python" || e.Context != "kernelspec-python3" || len(e.Results) != 1 || e.Results[0].Text != "3" {
		t.Fatalf("kernelspec python3: %+v", e)
	}
	e = g.run(map[string]any{"kernelspec": "python3", "isolated": true, "env": map[string]string{"KG_X": "x"}, "code": "import os; os.environ['KG_X']"})
	if e.Language != "python" || !strings.HasPrefix(e.Context, "isolated-") || len(e.Results) != 1 || e.Results[0].Text != "'x'" {
		t.Fatalf("isolated kernelspec python3: %+v", e)
	}
	status, body := g.do("POST", "/api/contexts", map[string]any{"id": "by-name", "kernelspec": "python3"})
	if status != 201 {
		t.Fatalf("create by kernelspec: %d %s", status, body)
	}
	if cm := decode[contextKernel](t, body); cm.Language != "python" || cm.Kernelspec != "python3" {
		t.Errorf("context %s", body)
	}
	if e := g.run(map[string]any{"context": "by-name", "code": "40 + 2"}); len(e.Results) != 1 || e.Results[0].Text != "42" {
		t.Errorf("run in it: %+v", e)
	}

	for _, tc := range []struct {
		name string
		path string
		body map[string]any
		want string
	}{
		{"unknown kernelspec", "/api/execute", map[string]any{"kernelspec": "nope", "code": "1"}, "r-site"},
		{"kernelspec of another language", "/api/execute", map[string]any{"kernelspec": "ir", "language": "python", "code": "1"}, "kernelspec ir runs r"},
		{"kernelspec other than the context's", "/api/execute", map[string]any{"kernelspec": "ir", "context": "by-name", "code": "1"}, "python3"},
		{"the id of another shared kernel", "/api/contexts", map[string]any{"id": "kernelspec-r-site", "kernelspec": "python3"}, "kernelspec r-site"},
		{"python outside the table", "/api/execute", map[string]any{"language": "python", "code": "1"}, "available: javascript, r"},
	} {
		status, body := g.do("POST", tc.path, tc.body)
		var eb struct{ Code, Message string }
		json.Unmarshal(body, &eb)
		if status != 400 || eb.Code != "BAD_REQUEST" || !strings.Contains(eb.Message, tc.want) {
			t.Errorf("%s: %d %s", tc.name, status, body)
		}
	}
}

// TestRKernelOnJupyterSurface: the ir kernelspec is served on the Jupyter
// surface, and its kernel answers a websocket client as Enterprise
// Gateway's own tests of IRkernel ask: hello world, the hostname, an
// interrupt that keeps state, a restart that drops it.
func TestRKernelOnJupyterSurface(t *testing.T) {
	needR(t)
	g := newGateway(t)
	status, body := g.do("GET", "/api/kernelspecs/ir", nil)
	if spec := decode[kernelspecModel](t, body); status != 200 || spec.Spec.Language != "R" || spec.Resources["logo-64x64"] != "/kernelspecs/ir/logo-64x64.png" {
		t.Fatalf("kernelspec ir: %d %s", status, body)
	}
	k := g.startKernel("ir")
	c := g.mustDial(k.ID, true)
	displayed := func(iopub []wsMsg) string {
		for _, m := range iopub {
			if m.Header.MsgType == jupyter.DisplayData || m.Header.MsgType == jupyter.ExecuteResult {
				return m.text(t)
			}
		}
		return ""
	}

	_, iopub := c.run(`cat("hello world\n")`)
	if got := summaryText(t, iopub, jupyter.StreamMsg); got != "hello world\n" {
		t.Errorf("hello world: %q (%s)", got, summary(iopub))
	}
	host, _ := os.Hostname()
	if _, iopub := c.run(`Sys.info()[["nodename"]]`); displayed(iopub) != `[1] "`+host+`"` {
		t.Errorf("hostname: %q, want %q", displayed(iopub), host)
	}

	// An interrupt as soon as the kernel takes the request (IRkernel then
	// sets the run up, outside its handler of interrupts), and again every
	// half second until the request ends: R stops the code and lives on.
	c.run("kept <- 3")
	id := c.execute("Sys.sleep(60)", false)
	c.until(10*time.Second, func(m wsMsg) bool {
		return m.ParentHeader.MsgID == id && m.Header.MsgType == jupyter.StatusMsg && m.state() == "busy"
	})
	interrupt := func() {
		if status, body := g.do("POST", "/api/kernels/"+k.ID+"/interrupt", nil); status != 204 {
			t.Fatalf("interrupt: %d %s", status, body)
		}
	}
	interrupt()
	deadline := time.After(20 * time.Second)
	again := time.NewTicker(500 * time.Millisecond)
	defer again.Stop()
	replied, idle := false, false
	for !replied || !idle {
		select {
		case m := <-c.msgs:
			if m.ParentHeader.MsgID != id {
				continue
			}
			switch {
			case m.Header.MsgType == jupyter.ExecuteReply:
				replied = true
			case m.Header.MsgType == jupyter.StatusMsg && m.state() == "idle":
				idle = true
			case m.Header.MsgType == jupyter.StatusMsg && m.state() != "busy":
				t.Fatalf("the kernel went %s during the interrupted request", m.state())
			}
		case <-again.C:
			interrupt()
		case <-deadline:
			t.Fatal("the interrupted request did not end")
		}
	}
	if _, iopub := c.run("kept"); displayed(iopub) != "[1] 3" {
		t.Errorf("state after the interrupt: %q", displayed(iopub))
	}

	if status, body := g.do("POST", "/api/kernels/"+k.ID+"/restart", map[string]any{}); status != 200 {
		t.Fatalf("restart: %d %s", status, body)
	}
	if _, iopub := c.run(`exists("kept")`); displayed(iopub) != "[1] FALSE" {
		t.Errorf("state after the restart: %q", displayed(iopub))
	}
}

// summaryText joins the text of the messages of type typ.
func summaryText(t *testing.T, ms []wsMsg, typ jupyter.MsgType) string {
	var out string
	for _, m := range ms {
		if m.Header.MsgType == typ {
			out += m.text(t)
		}
	}
	return out
}

// TestMCPRunsR: run_code offers r among its languages and runs it: the
// value and output as text, a plot as an image; create_context takes a
// kernelspec by name.
func TestMCPRunsR(t *testing.T) {
	needR(t)
	g := newGateway(t)
	cs, err := mcpClient(t, g, "Bearer "+g.token)
	if err != nil {
		t.Fatal(err)
	}
	list, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range list.Tools {
		if tool.Name == "run_code" {
			if js, _ := json.Marshal(tool.InputSchema); !strings.Contains(string(js), `"r"`) {
				t.Errorf("run_code's languages: %s", js)
			}
		}
	}
	res := call(t, cs, "run_code", map[string]any{"language": "r", "code": "cat('counted\\n'); sum(1:4)"})
	if got := texts(res); res.IsError || !strings.Contains(got, "counted") || !strings.Contains(got, "[1] 10") {
		t.Fatalf("run_code r: %q", got)
	}
	res = call(t, cs, "run_code", map[string]any{"language": "r", "code": "plot(1:10)"})
	images := 0
	for _, c := range res.Content {
		if im, ok := c.(*sdk.ImageContent); ok && im.MIMEType == "image/png" {
			images++
		}
	}
	if res.IsError || images != 1 {
		t.Errorf("plot: %d images, %q", images, texts(res))
	}
	res = call(t, cs, "create_context", map[string]any{"id": "mcp-r", "kernelspec": "ir"})
	if m := structured[map[string]any](t, res); res.IsError || m["language"] != "r" {
		t.Fatalf("create_context kernelspec ir: %s", texts(res))
	}
	res = call(t, cs, "run_code", map[string]any{"context": "mcp-r", "code": "stop('boom')"})
	if !res.IsError || !strings.Contains(texts(res), "boom") {
		t.Errorf("error: %q", texts(res))
	}
}

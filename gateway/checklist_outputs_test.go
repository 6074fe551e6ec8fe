package gateway

// The checklist, 26-30: outputs, redirects, Deno, startup files, stdin (helpers in checklist_helpers_test.go).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"kernelgate/internal/needs"
	"kernelgate/jupyter"
	"kernelgate/provision/local"
	"kernelgate/runs"
	"kernelgate/sessions"
	"kernelgate/web"
)

// B4 #26: "Outputs with text/html/application/javascript/SVG <script>" →
// "returned as data with application/json + nosniff; never rendered on API
// origin (nbconvert XSS advisory, CVE-2019-9644)".
//
// The API returns outputs inside JSON (Content-Type application/json or
// application/x-ndjson, X-Content-Type-Options: nosniff); no route serves
// an output as a document. The browser front-end, on the same origin,
// sends a Content Security Policy without inline scripts and renders HTML
// outputs in sandboxed iframes (web/README.md, web/e2e).
func TestB4_26_OutputsAreData(t *testing.T) {
	g := newGateway(t, func(_ *sessions.Config, c *Config) { c.Web = web.Handler() })
	code := `from IPython.display import display, HTML, Javascript
display(HTML('<script>alert("html")</script><img src=x onerror=alert(1)>'))
display(Javascript('alert("js")'))
display({'image/svg+xml': '<svg xmlns="http://www.w3.org/2000/svg"><script>alert("svg")</script></svg>'}, raw=True)
HTML('<script>alert("main")</script>')`
	req, _ := http.NewRequest("POST", g.url+"/api/execute", strings.NewReader(`{"code":`+strconv.Quote(code)+`}`))
	req.Header.Set("Authorization", "token "+testToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	check := func(what string, h http.Header, wantType string) {
		if ct := h.Get("Content-Type"); !strings.HasPrefix(ct, wantType) {
			t.Errorf("%s: Content-Type %q, want %s", what, ct, wantType)
		}
		if h.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: no X-Content-Type-Options: nosniff", what)
		}
	}
	check("POST /api/execute", resp.Header, "application/json")
	e := decode[runs.Execution](t, body)
	var html, js, svg, main bool
	for _, r := range e.Results {
		html = html || strings.Contains(r.HTML, `<script>alert("html")</script>`)
		var jsData string
		json.Unmarshal(r.Data["application/javascript"], &jsData)
		js = js || strings.Contains(jsData, `alert("js")`) || strings.Contains(r.JavaScript, `alert("js")`)
		svg = svg || strings.Contains(r.SVG, `<script>alert("svg")</script>`)
		main = main || (r.IsMainResult && strings.Contains(r.HTML, "main"))
	}
	if !html || !js || !svg || !main {
		t.Errorf("outputs not returned as data (html %v, javascript %v, svg %v, main %v): %s", html, js, svg, main, body)
	}
	// The raw body is JSON: the markup is inside strings, never at top level.
	if bytes.HasPrefix(bytes.TrimSpace(body), []byte("<")) {
		t.Errorf("body starts as markup")
	}
	// Streams and run records.
	sresp := startStream(t, g, map[string]any{"code": code})
	io.Copy(io.Discard, sresp.Body)
	sresp.Body.Close()
	check("streamed run", sresp.Header, "application/x-ndjson")
	for _, p := range []string{"/api/runs/" + e.ID, "/api/runs/" + e.ID + "/events"} {
		req, _ := http.NewRequest("GET", g.url+p, nil)
		req.Header.Set("Authorization", "token "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		want := "application/json"
		if strings.HasSuffix(p, "/events") {
			want = "application/x-ndjson"
		}
		check("GET "+p, resp.Header, want)
	}
	// Errors too.
	resp, errBody := b4Raw(t, g, "GET", "/api/runs/%3Cscript%3E", map[string]string{"Authorization": "token " + testToken})
	check("error", resp.Header, "application/json")
	if bytes.Contains(errBody, []byte("<script>")) {
		t.Errorf("the error body reflects markup: %s", errBody)
	}
	// The front-end page forbids inline scripts and framing.
	resp, _ = b4Raw(t, g, "GET", "/", nil)
	csp := resp.Header.Get("Content-Security-Policy")
	for _, d := range []string{"script-src 'self'", "object-src 'none'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, d) {
			t.Errorf("front-end CSP %q lacks %q", csp, d)
		}
	}
}

// B4 #27: "Any redirect parameter next=//evil.com, /\evil.com,
// https:evil.com" → "rejected (CVE-2020-26232, CVE-2023-39968)".
//
// kernelgate has no login page and no redirect parameter: no route answers
// 3xx, whatever the path or query (a trailing slash is routed, not
// redirected).
func TestB4_27_NoRedirects(t *testing.T) {
	g := newGateway(t, func(_ *sessions.Config, c *Config) { c.Web = web.Handler() })
	targets := []string{
		"/api/kernels?next=//evil.com", "/api/kernels/?next=//evil.com", "/api/kernelspecs?next=https:evil.com",
		"/?next=//evil.com", "/?next=/%5Cevil.com", "/index.html", "/index.html?next=//evil.com", "/static", "/static/",
		"/static/../", "/login?next=//evil.com", "/login?next=https:evil.com", "/logout?next=//evil.com",
		"/tree?next=//evil.com", "/api/", "/api/kernels/", "/api/contexts/", "/kernelspecs/python3/",
		"//evil.com", "//evil.com/", "/\\evil.com", "/%2F%2Fevil.com", "/%5Cevil.com", "///evil.com",
		"/api/kernels/..", "/api/kernels/../..", "/./api/kernels", "/api//kernels",
	}
	for _, target := range targets {
		for _, hdr := range []map[string]string{nil, {"Authorization": "token " + testToken}} {
			resp, _ := b4Raw(t, g, "GET", target, hdr)
			if resp.StatusCode >= 300 && resp.StatusCode < 400 {
				t.Errorf("GET %s: %d to %q", target, resp.StatusCode, resp.Header.Get("Location"))
			}
			if loc := resp.Header.Get("Location"); loc != "" {
				t.Errorf("GET %s: Location %q", target, loc)
			}
		}
	}
}

// B4 #28: "Deno cell: Deno.readTextFile("/etc/shadow"), new
// Deno.Command("sh"), fetch metadata IP" → "governed by OS sandbox (Deno
// kernel is --allow-all, deno#25692) → denied/blocked".
//
// Deno's permissions are not a boundary (the kernel runs with
// --allow-all): only the sandbox is. A subprocess runs but is confined
// (read-only host, own PID namespace); fetch to the metadata address fails
// at once with the network off. /etc/shadow: the sandbox runs as uid 0
// without capabilities, and the file is root's, so its owner bits let uid 0
// read it unless the sandbox hides it; the test requires that it is not
// readable.
func TestB4_28_DenoSandbox(t *testing.T) {
	b4NeedSandbox(t)
	g := newGateway(t, b4Sandboxed(local.SandboxConfig{}))
	b4Context(t, g, map[string]any{"id": "deno", "language": "javascript"})
	run := func(code string) string {
		t.Helper()
		e := g.run(map[string]any{"code": code, "context": "deno"})
		if e.Error != nil {
			t.Fatalf("%s: %s %s", code, e.Error.Name, e.Error.Value)
		}
		return b4Result(e)
	}
	t.Run("/etc/shadow", func(t *testing.T) {
		if _, err := os.Stat("/etc/shadow"); err != nil {
			needs.Skip(t, "no /etc/shadow here")
		}
		got := run(`let r; try { r = "read " + Deno.readTextFileSync("/etc/shadow").length + " bytes" } catch (e) { r = e.name }; r`)
		if strings.HasPrefix(got, `"read`) {
			t.Errorf("a sandboxed Deno kernel reads /etc/shadow: %s (uid 0 without capabilities still owns root's files: run kernels as an unprivileged uid or hide such files)", got)
		}
	})
	t.Run("subprocess", func(t *testing.T) {
		got := run(fmt.Sprintf(`const o = new Deno.Command("sh", {args: ["-c", "touch /usr/kg-b4 2>/dev/null && echo wrote || echo read-only; test -e /proc/%d && echo sees-gateway || echo no-gateway; ls /proc | grep -c '^[0-9]'"]}).outputSync(); new TextDecoder().decode(o.stdout).trim().split("\n").join(" ")`, os.Getpid()))
		f := strings.Fields(strings.Trim(got, `"`))
		if len(f) != 3 || f[0] != "read-only" || f[1] != "no-gateway" {
			t.Errorf("sh from Deno: %s, want read-only, no-gateway", got)
		}
		if n, _ := strconv.Atoi(f[len(f)-1]); n > 10 {
			t.Errorf("sh from Deno sees %d processes", n)
		}
	})
	t.Run("fetch metadata", func(t *testing.T) {
		got := run(`const t0 = Date.now(); let r; try { r = "status-" + (await fetch("http://169.254.169.254/latest/meta-data/", {signal: AbortSignal.timeout(2000)})).status } catch (e) { r = e.name }; r + " " + (Date.now() - t0)`)
		var outcome string
		var ms float64
		if _, err := fmt.Sscanf(strings.Trim(got, `"'`), "%s %g", &outcome, &ms); err != nil {
			t.Fatalf("fetch: %s: %v", got, err)
		}
		if strings.HasPrefix(outcome, "status") || outcome == "TimeoutError" || ms > 1500 {
			t.Errorf("fetch of the metadata address from a sandboxed Deno kernel: %s after %.0f ms, want a fast failure", outcome, ms)
		}
	})
}

// b4PlantProbe reads the marks the planted files would set.
const b4PlantProbe = "import os; [os.environ.get(k) for k in ('KG_IPYCFG', 'KG_IPYKCFG', 'KG_STARTUP', 'KG_PTH', 'KG_USERCUSTOM', 'KG_JCFG', 'KG_LAUNCHER')]"

// b4Plant writes startup and configuration files into HOME and the working
// directory that, if obeyed, set marks in the environment.
const b4Plant = `
import os, site, sys
home, cwd = os.environ['HOME'], os.getcwd()
def put(p, s):
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, 'w') as f:
        f.write(s)
cfg = "c.InteractiveShellApp.exec_lines = ['import os; os.environ[\"%s\"] = \"ran\"']\n"
for d in (cwd, os.path.join(os.environ.get('IPYTHONDIR', home + '/.ipython'), 'profile_default')):
    put(os.path.join(d, 'ipython_config.py'), cfg % 'KG_IPYCFG')
    put(os.path.join(d, 'ipython_kernel_config.py'), cfg % 'KG_IPYKCFG')
put(os.path.join(os.environ.get('IPYTHONDIR', home + '/.ipython'), 'profile_default', 'startup', '00-kg.py'), "import os; os.environ['KG_STARTUP'] = 'ran'\n")
usersite = site.getusersitepackages()
put(os.path.join(usersite, 'kg.pth'), "import os; os.environ['KG_PTH'] = 'ran'\n")
put(os.path.join(usersite, 'usercustomize.py'), "import os; os.environ['KG_USERCUSTOM'] = 'ran'\n")
for d in (cwd, os.environ.get('JUPYTER_CONFIG_DIR', home + '/.jupyter')):
    for n in ('jupyter_config.py', 'jupyter_kernel_config.py', 'jupyter_server_config.py'):
        put(os.path.join(d, n), "import os; os.environ['KG_JCFG'] = 'ran'\n")
put(os.path.join(cwd, 'ipykernel_launcher.py'), '''import os, sys
os.environ["KG_LAUNCHER"] = "ran"
cwd = os.getcwd()
sys.path[:] = [p for p in sys.path if p not in ("", cwd)]
from ipykernel import kernelapp as app
app.launch_new_instance()
''')
print('planted')
`

// B4 #29: "Cell writes ipython_config.py, .pth, deno.json,
// jupyter_*_config.py into cwd/HOME, then restart kernel" → "restarted
// kernel does not execute/obey them (fresh gateway-owned dir;
// CVE-2022-21699/39286, deno PR #35587)".
//
// Every launch gets fresh HOME, IPython, Jupyter and working directories,
// so a restarted context starts clean. A working directory the caller
// chose (inside --workspace-root) persists across restarts: files planted
// there must not be obeyed at the next start either. ipykernel is started
// as "python -m ipykernel_launcher", which puts the working directory first
// on sys.path (a planted ipykernel_launcher.py would run instead of the
// real one), and Deno reads deno.json from its working directory.
func TestB4_29_StartupFilesIgnoredAfterRestart(t *testing.T) {
	g := newGateway(t)
	for _, c := range []struct{ name, cwd string }{{"fresh dirs", ""}, {"caller's cwd", "proj"}} {
		t.Run(c.name, func(t *testing.T) {
			id := strings.ReplaceAll(c.name, " ", "-")
			id = strings.ReplaceAll(id, "'", "")
			body := map[string]any{"id": id}
			if c.cwd != "" {
				body["cwd"] = c.cwd
			}
			b4Context(t, g, body)
			if e := g.run(map[string]any{"code": b4Plant, "context": id}); strings.TrimSpace(b4Stdout(e)) != "planted" {
				t.Fatalf("planting: %+v", e)
			}
			status, out := g.do("POST", "/api/contexts/"+id+"/restart", nil)
			if status != http.StatusOK {
				t.Fatalf("restart: %d %s", status, out)
			}
			e := g.run(map[string]any{"code": b4PlantProbe, "context": id})
			if got := b4Result(e); got != "[None, None, None, None, None, None, None]" {
				t.Errorf("restarted kernel obeyed planted files (ipython_config, ipython_kernel_config, startup, .pth, usercustomize, jupyter config, ipykernel_launcher.py): %s", got)
			}
		})
	}
	for _, c := range []struct{ name, cwd string }{{"deno.json, fresh dirs", ""}, {"deno.json, caller's cwd", "deno"}} {
		t.Run(c.name, func(t *testing.T) {
			id := "deno-" + strconv.Itoa(len(c.cwd))
			body := map[string]any{"id": id, "language": "typescript"}
			if c.cwd != "" {
				body["cwd"] = c.cwd
			}
			b4Context(t, g, body)
			plant := `Deno.writeTextFileSync("deno.json", JSON.stringify({imports: {"kgprobe": "./probe.js"}}));
Deno.writeTextFileSync("probe.js", "export default 'planted';");
1`
			if e := g.run(map[string]any{"code": plant, "context": id, "language": "typescript"}); e.Error != nil {
				t.Fatalf("planting: %+v", e.Error)
			}
			if status, out := g.do("POST", "/api/contexts/"+id+"/restart", nil); status != http.StatusOK {
				t.Fatalf("restart: %d %s", status, out)
			}
			e := g.run(map[string]any{"code": `let r; try { r = (await import("kgprobe")).default } catch (e) { r = "not resolved" }; r`, "context": id, "language": "typescript"})
			if got := b4Result(e); got != `"not resolved"` {
				t.Errorf("restarted Deno kernel resolved an import through a planted deno.json: %s", got)
			}
		})
	}
}

// B4 #30: "input() with allow_stdin=false; pending input_request then
// shutdown/interrupt" → "StdinNotImplementedError; shutdown/interrupt not
// blocked".
//
// TestExecuteSeeds ("input without stdin fails fast") covers /api/execute
// without stdin; this adds the websocket with allow_stdin false, and runs
// blocked in input() (streamed with stdin: true, and over the websocket)
// that are interrupted, and whose context or kernel is deleted.
func TestB4_30_StdinNeverBlocks(t *testing.T) {
	g := newGateway(t)
	b4Context(t, g, map[string]any{"id": "stdin"})

	t.Run("websocket without stdin", func(t *testing.T) {
		k := g.startKernel("python3")
		c := g.mustDial(k.ID, true)
		reply, _ := c.run("input('name? ')")
		var r struct {
			Status, Ename string
		}
		decodeInto(t, reply.Content, &r)
		if r.Status != "error" || r.Ename != "StdinNotImplementedError" {
			t.Errorf("input() with allow_stdin false: %+v", r)
		}
	})

	awaitInput := func(t *testing.T) (*http.Response, *bufio.Scanner, string) {
		resp := startStream(t, g, map[string]any{"code": "input('waiting? ')", "context": "stdin", "stdin": true})
		sc := bufio.NewScanner(resp.Body)
		evs := readEvents(t, sc, func(e event) bool { return e.Type == "input_request" })
		if last := evs[len(evs)-1]; last.Type != "input_request" {
			t.Fatalf("no input_request: %s", last.Raw)
		}
		return resp, sc, evs[0].Run
	}
	t.Run("interrupt while waiting", func(t *testing.T) {
		resp, sc, run := awaitInput(t)
		defer resp.Body.Close()
		t0 := time.Now()
		if status, _ := g.do("POST", "/api/runs/"+run+"/interrupt", nil); status != http.StatusNoContent {
			t.Fatalf("interrupt: %d", status)
		}
		evs := readEvents(t, sc, func(e event) bool { return e.Type == "end" })
		end := evs[len(evs)-1]
		if end.Type != "end" || end.Process.Reason != runs.Interrupted || time.Since(t0) > 5*time.Second {
			t.Errorf("end %s after %v, want interrupted", end.Raw, time.Since(t0))
		}
		if e := g.run(map[string]any{"code": "6*7", "context": "stdin"}); b4Result(e) != "42" {
			t.Errorf("next run: %+v", e)
		}
	})
	t.Run("delete the context while waiting", func(t *testing.T) {
		resp, sc, _ := awaitInput(t)
		defer resp.Body.Close()
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "DELETE", g.url+"/api/contexts/stdin", nil)
		req.Header.Set("Authorization", "token "+testToken)
		dresp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("DELETE while input() waits: %v", err)
		}
		dresp.Body.Close()
		if dresp.StatusCode != http.StatusNoContent || time.Since(t0) > 5*time.Second {
			t.Errorf("DELETE: %d after %v", dresp.StatusCode, time.Since(t0))
		}
		evs := readEvents(t, sc, func(e event) bool { return e.Type == "end" })
		if end := evs[len(evs)-1]; end.Type != "end" || end.Process.Reason != runs.Lost {
			t.Errorf("the waiting run ended with %s, want lost", end.Raw)
		}
	})
	t.Run("delete the kernel while a websocket waits", func(t *testing.T) {
		k := g.startKernel("python3")
		c := g.mustDial(k.ID, true)
		c.execute("input('waiting? ')", true)
		c.until(10*time.Second, func(m wsMsg) bool { return m.Header.MsgType == jupyter.InputRequest })
		t0 := time.Now()
		if status, _ := g.do("DELETE", "/api/kernels/"+k.ID, nil); status != http.StatusNoContent || time.Since(t0) > 5*time.Second {
			t.Errorf("DELETE: %d after %v", status, time.Since(t0))
		}
		deadline := time.NewTimer(5 * time.Second)
		defer deadline.Stop()
		for {
			select {
			case _, ok := <-c.msgs:
				if !ok {
					return
				}
			case <-deadline.C:
				t.Fatalf("the websocket stayed open after its kernel was deleted")
			}
		}
	})
}

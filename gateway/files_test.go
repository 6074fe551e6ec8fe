package gateway

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"kernelgate/internal/needs"
	"kernelgate/provision/local"
	"kernelgate/runs"
	"kernelgate/sessions"
	"kernelgate/workspace"
)

// put uploads body as path into context id.
func (g *testGateway) put(id, path string, body io.Reader, headers map[string]string) (int, []byte) {
	g.t.Helper()
	req, err := http.NewRequest("PUT", g.url+"/api/contexts/"+id+"/files/"+path, body)
	if err != nil {
		g.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+g.token)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// get downloads path of context id.
func (g *testGateway) get(id, path string, headers map[string]string) (*http.Response, []byte) {
	g.t.Helper()
	req, err := http.NewRequest("GET", g.url+"/api/contexts/"+id+"/files/"+path, nil)
	if err != nil {
		g.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+g.token)
	for k, v := range headers {
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

func stdoutOf(e runs.Execution) string { return strings.Join(e.Logs.Stdout, "") }

func mustRun(t *testing.T, g *testGateway, body map[string]any) runs.Execution {
	t.Helper()
	e := g.run(body)
	if e.Error != nil {
		t.Fatalf("%v: %s: %s\n%s", body["code"], e.Error.Name, e.Error.Value, strings.Join(e.Error.Traceback, "\n"))
	}
	return e
}

// TestFilesOfAContext: a file uploaded is read by the kernel from its cwd;
// what the kernel writes is downloaded (type, length, ranges); the
// listing, removal, the workspace kept across a restart and removed with
// the context.
func TestFilesOfAContext(t *testing.T) {
	g := newGateway(t)
	ctx := b4Context(t, g, map[string]any{"id": "files"})
	if fi, err := os.Stat(ctx.Cwd); err != nil || !fi.IsDir() {
		t.Fatalf("context cwd %q: %v", ctx.Cwd, err)
	}

	csv := "region,sales\nnorth,10\nsouth,32\n"
	status, out := g.put("files", "data/sales.csv", strings.NewReader(csv), map[string]string{"Content-Type": "text/csv"})
	if status != http.StatusCreated {
		t.Fatalf("PUT: %d %s", status, out)
	}
	up := decode[fileModel](t, out)
	if up.Path != "data/sales.csv" || up.Size != int64(len(csv)) || len(up.Modified) != len("2026-01-02T03:04:05.123456Z") {
		t.Errorf("PUT answer %s", out)
	}

	e := mustRun(t, g, map[string]any{"context": "files", "code": `
import os, pandas as pd, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
df = pd.read_csv("data/sales.csv")
print(os.getcwd(), int(df.sales.sum()))
df.plot.bar(x="region", y="sales")
os.makedirs("out", exist_ok=True)
plt.savefig("out/plot.png")
open("out/clean.csv", "w").write(df.to_csv(index=False))
`})
	if got, want := strings.TrimSpace(stdoutOf(e)), ctx.Cwd+" 42"; got != want {
		t.Errorf("kernel printed %q, want %q", got, want)
	}

	resp, body := g.get("files", "out/plot.png", nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "image/png" || !bytes.HasPrefix(body, []byte("\x89PNG")) {
		t.Fatalf("download: %d %q %d bytes", resp.StatusCode, resp.Header.Get("Content-Type"), len(body))
	}
	if resp.Header.Get("Content-Length") != fmt.Sprint(len(body)) {
		t.Errorf("Content-Length %q for %d bytes", resp.Header.Get("Content-Length"), len(body))
	}
	resp, part := g.get("files", "out/plot.png", map[string]string{"Range": "bytes=1-3"})
	if resp.StatusCode != http.StatusPartialContent || string(part) != "PNG" {
		t.Errorf("range: %d %q", resp.StatusCode, part)
	}
	resp, body = g.get("files", "out/clean.csv", nil)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/csv") || string(body) != csv {
		t.Errorf("clean.csv: %d %q %q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}

	status, out = g.do("GET", "/api/contexts/files/files", nil)
	var names []string
	for _, f := range decode[[]fileModel](t, out) {
		if !strings.HasPrefix(f.Name, ".") {
			names = append(names, f.Path+":"+f.Type)
		}
	}
	if status != 200 || strings.Join(names, " ") != "data:dir out:dir" {
		t.Errorf("listing: %d %v (%s)", status, names, out)
	}
	status, out = g.do("GET", "/api/contexts/files/files?path=out&recursive=true", nil)
	if list := decode[[]fileModel](t, out); status != 200 || len(list) != 2 || list[0].Path != "out/clean.csv" || list[1].Path != "out/plot.png" || list[1].Size == 0 {
		t.Errorf("listing out: %d %s", status, out)
	}
	if status, out := g.do("GET", "/api/contexts/files/files?path=nope", nil); status != 404 || decode[map[string]string](t, out)["code"] != "NOT_FOUND" {
		t.Errorf("listing a missing folder: %d %s", status, out)
	}

	// Kept across a restart of the kernel.
	if status, out := g.do("POST", "/api/contexts/files/restart", nil); status != 200 {
		t.Fatalf("restart: %d %s", status, out)
	}
	e = mustRun(t, g, map[string]any{"context": "files", "code": "import os; print(sorted(os.listdir('out')))"})
	if got := strings.TrimSpace(stdoutOf(e)); got != "['clean.csv', 'plot.png']" {
		t.Errorf("after restart: %s", got)
	}

	// Removal.
	if status, out := g.do("DELETE", "/api/contexts/files/files/out/plot.png", nil); status != 204 {
		t.Errorf("delete file: %d %s", status, out)
	}
	if resp, body := g.get("files", "out/plot.png", nil); resp.StatusCode != 404 || !strings.Contains(string(body), "NOT_FOUND") {
		t.Errorf("deleted file: %d %s", resp.StatusCode, body)
	}
	if status, out := g.do("DELETE", "/api/contexts/files/files/data", nil); status != 400 {
		t.Errorf("delete folder without recursive: %d %s", status, out)
	}
	if status, out := g.do("DELETE", "/api/contexts/files/files/data?recursive=true", nil); status != 204 {
		t.Errorf("delete folder: %d %s", status, out)
	}
	e = mustRun(t, g, map[string]any{"context": "files", "code": "import os; print(os.path.exists('data'), os.path.exists('out/plot.png'), os.path.exists('out/clean.csv'))"})
	if got := strings.TrimSpace(stdoutOf(e)); got != "False False True" {
		t.Errorf("kernel sees after deletes: %s", got)
	}

	// Deleted with the context.
	if status, _ := g.do("DELETE", "/api/contexts/files", nil); status != 204 {
		t.Fatal("delete context")
	}
	if _, err := os.Stat(ctx.Cwd); !os.IsNotExist(err) {
		t.Errorf("workspace left after delete: %v", err)
	}
	if resp, body := g.get("files", "out/clean.csv", nil); resp.StatusCode != 404 || !strings.Contains(string(body), "SESSION_NOT_FOUND") {
		t.Errorf("files of a deleted context: %d %s", resp.StatusCode, body)
	}
}

// TestFilesEscapesRefused: no path leads out of the workspace, whether
// by "..", encoded separators, absolute paths or symlinks the kernel made.
func TestFilesEscapesRefused(t *testing.T) {
	g := newGateway(t)
	ctx := b4Context(t, g, map[string]any{"id": "esc"})
	b4Context(t, g, map[string]any{"id": "other"})
	g.put("other", "secret.txt", strings.NewReader("other's secret"), nil)
	mustRun(t, g, map[string]any{"context": "esc", "code": `
import os
os.symlink("/etc", "etc")
os.symlink("/etc/passwd", "passwd")
os.symlink("../other", "sibling")
os.symlink("../../..", "up")
open("fine.txt", "w").write("fine")
`})
	leaked := func(body []byte) bool {
		return bytes.Contains(body, []byte("root:x:0:0")) || bytes.Contains(body, []byte("other's secret"))
	}
	for _, p := range []string{
		"../other/secret.txt", "..%2fother%2fsecret.txt", "%2e%2e%2fother%2fsecret.txt", "%2e%2e/other/secret.txt",
		"%2fetc%2fpasswd", "/etc/passwd", "etc/passwd", "passwd", "sibling/secret.txt", "up/etc/passwd",
		"etc%2fpasswd", "fine.txt%00", "a%5c..%5c..%5cetc",
	} {
		resp, body := g.get("esc", p, nil)
		if resp.StatusCode != 400 && resp.StatusCode != 404 || leaked(body) {
			t.Errorf("GET %s: %d %.80q", p, resp.StatusCode, body)
		}
		if p == "passwd" {
			continue // a write replaces the symlink itself: checked below
		}
		if status, body := g.put("esc", p, strings.NewReader("x"), nil); status != 400 && status != 404 {
			t.Errorf("PUT %s: %d %s", p, status, body)
		}
	}
	for _, q := range []string{"..", "../other", "/etc", "etc", "sibling", "up"} {
		status, body := g.do("GET", "/api/contexts/esc/files?path="+q, nil)
		if status != 400 && status != 404 || leaked(body) || bytes.Contains(body, []byte("shadow")) {
			t.Errorf("list %s: %d %.80q", q, status, body)
		}
	}
	if _, err := os.Stat("/etc/x"); err == nil {
		t.Fatal("a write reached /etc")
	}
	if b, _ := os.ReadFile(filepath.Join(filepath.Dir(ctx.Cwd), "other", "secret.txt")); string(b) != "other's secret" {
		t.Errorf("the other context's file changed: %q", b)
	}
	// Removing a symlink removes the link, not its target.
	if status, out := g.do("DELETE", "/api/contexts/esc/files/passwd", nil); status != 204 {
		t.Errorf("delete symlink: %d %s", status, out)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatal("deleting a symlink removed its target")
	}
	// Writing over a symlink replaces the link, never its target.
	if status, out := g.put("esc", "etc", strings.NewReader("mine"), nil); status != 201 {
		t.Errorf("PUT over a symlink: %d %s", status, out)
	}
	if fi, err := os.Lstat(filepath.Join(ctx.Cwd, "etc")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("etc after the write: %v %v", fi, err)
	}
	// What stays inside is served.
	if resp, body := g.get("esc", "fine.txt", nil); resp.StatusCode != 200 || string(body) != "fine" {
		t.Errorf("fine.txt: %d %q", resp.StatusCode, body)
	}
	status, out := g.do("GET", "/api/contexts/esc/files", nil)
	for _, f := range decode[[]fileModel](t, out) {
		if f.Name == "up" && f.Type != "symlink" {
			t.Errorf("up listed as %s", f.Type)
		}
	}
	if status != 200 {
		t.Errorf("listing: %d", status)
	}
}

// TestFilesScopesAndContextTokens: read keys list and download, exec keys
// upload and delete; a context token reaches its own context's files only.
func TestFilesScopesAndContextTokens(t *testing.T) {
	const readSecret, execSecret = "read-secret-0123456789", "exec-secret-0123456789"
	rk, _ := ParseAPIKey("reader read " + readSecret)
	xk, _ := ParseAPIKey("writer exec " + execSecret)
	g := newGateway(t, func(_ *sessions.Config, c *Config) { c.APIKeys = []APIKey{rk, xk} })
	b4Context(t, g, map[string]any{"id": "mine"})
	b4Context(t, g, map[string]any{"id": "theirs"})
	g.put("theirs", "t.txt", strings.NewReader("theirs"), nil)
	status, out := g.do("POST", "/api/contexts/mine/tokens", map[string]any{"ttl": 60})
	if status != 201 {
		t.Fatalf("token: %d %s", status, out)
	}
	ctxTok := decode[map[string]string](t, out)["token"]

	as := func(tok string) *testGateway { h := *g; h.token = tok; return &h }
	cases := []struct {
		who, tok      string
		put, get, del int
		list          int
		ctx           string
	}{
		{"read key", readSecret, 403, 200, 403, 200, "theirs"},
		{"exec key", execSecret, 201, 403, 204, 403, "theirs"},
		{"context token, own", ctxTok, 201, 200, 204, 200, "mine"},
		{"context token, other", ctxTok, 403, 403, 403, 403, "theirs"},
	}
	for _, c := range cases {
		t.Run(c.who, func(t *testing.T) {
			h := as(c.tok)
			if c.get == 200 || c.who == "context token, other" {
				g.put(c.ctx, "t.txt", strings.NewReader("theirs"), nil)
			}
			if status, out := h.put(c.ctx, "new.txt", strings.NewReader("x"), nil); status != c.put {
				t.Errorf("PUT: %d %s", status, out)
			}
			if resp, body := h.get(c.ctx, "t.txt", nil); resp.StatusCode != c.get {
				t.Errorf("GET: %d %s", resp.StatusCode, body)
			}
			if status, out := h.do("GET", "/api/contexts/"+c.ctx+"/files", nil); status != c.list {
				t.Errorf("list: %d %s", status, out)
			}
			if status, out := h.do("DELETE", "/api/contexts/"+c.ctx+"/files/t.txt", nil); status != c.del {
				t.Errorf("DELETE: %d %s", status, out)
			}
		})
	}
	if status, _ := as("").do("GET", "/api/contexts/mine/files", nil); status != 401 {
		t.Errorf("no credentials: %d", status)
	}
}

// TestFilesUploadLimit: a body over --max-upload is PAYLOAD_TOO_LARGE,
// whether it announces its length or not, and leaves no file.
func TestFilesUploadLimit(t *testing.T) {
	g := newGateway(t, func(_ *sessions.Config, c *Config) { c.MaxUploadBytes = 1000 })
	ctx := b4Context(t, g, map[string]any{"id": "lim"})
	if status, out := g.put("lim", "ok.bin", bytes.NewReader(make([]byte, 1000)), nil); status != 201 {
		t.Errorf("at the limit: %d %s", status, out)
	}
	status, out := g.put("lim", "big.bin", bytes.NewReader(make([]byte, 1001)), nil)
	if status != 413 || decode[map[string]string](t, out)["code"] != "PAYLOAD_TOO_LARGE" {
		t.Errorf("over the limit: %d %s", status, out)
	}
	// No Content-Length: the body is cut at the limit.
	status, out = g.put("lim", "big.bin", io.MultiReader(bytes.NewReader(make([]byte, 600)), bytes.NewReader(make([]byte, 600))), nil)
	if status != 413 {
		t.Errorf("chunked over the limit: %d %s", status, out)
	}
	des, _ := os.ReadDir(ctx.Cwd)
	for _, d := range des {
		if d.Name() != "ok.bin" && d.Name() != ".local" {
			t.Errorf("left in the workspace: %s", d.Name())
		}
	}
}

// TestWorkspacesOfSharedAndIsolatedRuns: the shared kernel works in a
// workspace of its own; an isolated run in a fresh one, removed after it.
func TestWorkspacesOfSharedAndIsolatedRuns(t *testing.T) {
	g := newGateway(t, func(m *sessions.Config, _ *Config) { m.PoolSize = 1 })
	mustRun(t, g, map[string]any{"code": "open('shared.txt', 'w').write('s')"})
	if resp, body := g.get("code-python", "shared.txt", nil); resp.StatusCode != 200 || string(body) != "s" {
		t.Errorf("shared kernel's file: %d %q", resp.StatusCode, body)
	}
	for _, cwd := range []string{"", "sub/dir"} {
		e := mustRun(t, g, map[string]any{"isolated": true, "cwd": cwd, "code": "import os; open('iso.txt', 'w').write('i'); print(os.getcwd())"})
		dir := strings.TrimSpace(stdoutOf(e))
		if !strings.Contains(dir, "/runs/") || (cwd != "" && !strings.HasSuffix(dir, "/"+cwd)) {
			t.Errorf("isolated cwd %q for %q", dir, cwd)
		}
		ws := dir
		if cwd != "" {
			ws = strings.TrimSuffix(dir, "/"+cwd)
		}
		// Removed once the kernel is shut down, just after the answer.
		eventually(t, 10*time.Second, func() bool { _, err := os.Stat(ws); return os.IsNotExist(err) })
	}
	status, out := g.do("POST", "/api/execute", map[string]any{"isolated": true, "cwd": "/etc", "code": "1"})
	if status != 400 {
		t.Errorf("isolated cwd outside the workspace: %d %s", status, out)
	}
	status, out = g.do("POST", "/api/contexts", map[string]any{"cwd": "../x"})
	if status != 400 {
		t.Errorf("context cwd outside the workspace: %d %s", status, out)
	}
	ctx := b4Context(t, g, map[string]any{"id": "sub", "cwd": "work/here"})
	if !strings.HasSuffix(ctx.Cwd, "/contexts/sub/work/here") {
		t.Errorf("context cwd %s", ctx.Cwd)
	}
	g.put("sub", "top.txt", strings.NewReader("top"), nil)
	e := mustRun(t, g, map[string]any{"context": "sub", "code": "import os; print(os.getcwd() == " + fmt.Sprintf("%q", ctx.Cwd) + ", open('../../top.txt').read())"})
	if got := strings.TrimSpace(stdoutOf(e)); got != "True top" {
		t.Errorf("kernel in a folder of its workspace: %s", got)
	}
}

// TestFilesDeno: a Deno context works in its workspace too, and caches
// its npm: and jsr: imports there.
func TestFilesDeno(t *testing.T) {
	g := newGateway(t)
	ctx := b4Context(t, g, map[string]any{"id": "deno", "language": "typescript"})
	g.put("deno", "in.txt", strings.NewReader("from upload"), nil)
	e := mustRun(t, g, map[string]any{"context": "deno", "language": "typescript", "code": `
Deno.writeTextFileSync("out.txt", Deno.readTextFileSync("in.txt").toUpperCase());
console.log(Deno.cwd());
console.log(Deno.env.get("DENO_DIR"));`})
	lines := strings.Split(strings.TrimSpace(stdoutOf(e)), "\n")
	if len(lines) != 2 || lines[0] != ctx.Cwd || lines[1] != ctx.Cwd+"/.cache/deno" {
		t.Errorf("Deno cwd and DENO_DIR: %q (workspace %s)", lines, ctx.Cwd)
	}
	if resp, body := g.get("deno", "out.txt", nil); resp.StatusCode != 200 || string(body) != "FROM UPLOAD" {
		t.Errorf("Deno's file: %d %q", resp.StatusCode, body)
	}
}

// TestFilesSandboxed: with --sandbox the kernel sees the files uploaded at
// its cwd, and the gateway serves what the kernel wrote; another
// context's workspace stays out of its reach.
func TestFilesSandboxed(t *testing.T) {
	b4NeedSandbox(t)
	root := b4HostDir(t)
	g := newGateway(t, b4Sandboxed(local.SandboxConfig{}), func(m *sessions.Config, _ *Config) {
		m.Workspaces = mustRoot(t, root)
	})
	ctx := b4Context(t, g, map[string]any{"id": "sb"})
	b4Context(t, g, map[string]any{"id": "other"})
	g.put("other", "secret.txt", strings.NewReader("other's secret"), nil)
	g.put("sb", "in/data.txt", strings.NewReader("uploaded"), nil)
	e := mustRun(t, g, map[string]any{"context": "sb", "code": `
import os
print(os.getcwd(), os.getuid(), open("in/data.txt").read())
open("in/data.txt", "a").write(" and appended")
os.makedirs("made", exist_ok=True)
open("made/by-kernel.txt", "w").write("written in the sandbox")
try:
    print(open(os.path.join(os.path.dirname(os.getcwd()), "other", "secret.txt")).read())
except OSError as e:
    print("other:", type(e).__name__)
`})
	out := stdoutOf(e)
	if !strings.HasPrefix(out, ctx.Cwd+" ") || !strings.Contains(out, " uploaded\n") || strings.Contains(out, "other's secret") {
		t.Errorf("sandboxed kernel printed %q", out)
	}
	if resp, body := g.get("sb", "made/by-kernel.txt", nil); resp.StatusCode != 200 || string(body) != "written in the sandbox" {
		t.Errorf("download: %d %q", resp.StatusCode, body)
	}
	if resp, body := g.get("sb", "in/data.txt", nil); string(body) != "uploaded and appended" {
		t.Errorf("the kernel could not write an uploaded file: %d %q", resp.StatusCode, body)
	}
	// An upload over the kernel's file stays writable by the kernel.
	g.put("sb", "in/data.txt", strings.NewReader("again"), nil)
	e = mustRun(t, g, map[string]any{"context": "sb", "code": `open("in/data.txt", "a").write("!"); print(open("in/data.txt").read())`})
	if got := strings.TrimSpace(stdoutOf(e)); got != "again!" {
		t.Errorf("after a second upload: %q", got)
	}
}

// wheel builds a pure-Python wheel of module name whose VALUE is value.
func wheel(t *testing.T, dir, name, version, value string) {
	t.Helper()
	info := name + "-" + version + ".dist-info/"
	files := []struct{ path, body string }{
		{name + "/__init__.py", "VALUE = " + value + "\n"},
		{info + "METADATA", "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n"},
		{info + "WHEEL", "Wheel-Version: 1.0\nGenerator: kernelgate-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	for _, f := range files {
		w, _ := z.Create(f.path)
		io.WriteString(w, f.body)
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.path, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString(info + "RECORD,,\n")
	w, _ := z.Create(info + "RECORD")
	io.WriteString(w, record.String())
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+"-"+version+"-py3-none-any.whl"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPackagesPerContext: packages installed on create, or with %pip in a
// kernel, land in that context only: not in another context, not in the
// system's Python; Debian's packages stay importable; a failed install is
// BAD_REQUEST with pip's message and leaves no context.
func TestPackagesPerContext(t *testing.T) {
	wheels := t.TempDir()
	wheel(t, wheels, "kgwheel", "1.0", "42")
	wheel(t, wheels, "kgpip", "2.0", "'pip'")
	g := newGateway(t, func(m *sessions.Config, _ *Config) {
		m.PipFindLinks, m.PipNoIndex = []string{wheels}, true
	})
	b4Context(t, g, map[string]any{"id": "p1", "packages": []string{"kgwheel==1.0"}})
	b4Context(t, g, map[string]any{"id": "p2"})
	probe := "import importlib.util as u, numpy, pandas, matplotlib; print([u.find_spec(m) is not None for m in ('kgwheel', 'kgpip')])"
	if got := strings.TrimSpace(stdoutOf(mustRun(t, g, map[string]any{"context": "p1", "code": probe + "\nimport kgwheel; print(kgwheel.VALUE)"}))); got != "[True, False]\n42" {
		t.Errorf("p1 after create: %q", got)
	}
	e := mustRun(t, g, map[string]any{"context": "p2", "code": "%pip install kgpip\nimport kgpip; print(kgpip.VALUE)"})
	if got := stdoutOf(e); !strings.HasSuffix(strings.TrimSpace(got), "\npip") {
		t.Errorf("%%pip install in p2: %q %q", got, e.Logs.Stderr)
	}
	if got := strings.TrimSpace(stdoutOf(mustRun(t, g, map[string]any{"context": "p2", "code": probe}))); got != "[False, True]" {
		t.Errorf("p2: %q", got)
	}
	if got := strings.TrimSpace(stdoutOf(mustRun(t, g, map[string]any{"context": "p1", "code": probe}))); got != "[True, False]" {
		t.Errorf("p1 after p2's install: %q", got)
	}
	// Kept across a restart.
	g.do("POST", "/api/contexts/p1/restart", nil)
	if got := strings.TrimSpace(stdoutOf(mustRun(t, g, map[string]any{"context": "p1", "code": probe}))); got != "[True, False]" {
		t.Errorf("p1 after restart: %q", got)
	}
	if out, err := exec.Command("/usr/bin/python3", "-c", "import kgwheel").CombinedOutput(); err == nil {
		t.Errorf("the system's Python imports kgwheel: %s", out)
	}
	if out, err := exec.Command("/usr/bin/python3", "-c", "import kgpip").CombinedOutput(); err == nil {
		t.Errorf("the system's Python imports kgpip: %s", out)
	}

	status, out := g.do("POST", "/api/contexts", map[string]any{"id": "p3", "packages": []string{"kgnosuch"}})
	if body := decode[map[string]string](t, out); status != 400 || body["code"] != "BAD_REQUEST" || !strings.Contains(body["message"], "kgnosuch") || !strings.Contains(body["message"], "No matching distribution") {
		t.Errorf("failed install: %d %s", status, out)
	}
	if status, _ := g.do("GET", "/api/contexts/p3", nil); status != 404 {
		t.Errorf("a context whose install failed exists: %d", status)
	}
	for _, bad := range []string{"--index-url=http://x", "-r/etc/passwd", "a b", "x; import os"} {
		if status, out := g.do("POST", "/api/contexts", map[string]any{"packages": []string{bad}}); status != 400 {
			t.Errorf("package %q: %d %s", bad, status, out)
		}
	}
}

// TestLanguages: GET /api/languages names each language's kernelspec and,
// once a kernel of it has started, the version it reports.
func TestLanguages(t *testing.T) {
	g := newGateway(t)
	mustRun(t, g, map[string]any{"code": "1"})
	status, out := g.do("GET", "/api/languages", nil)
	if status != 200 {
		t.Fatalf("%d %s", status, out)
	}
	got := map[string]sessions.LanguageInfo{}
	for _, l := range decode[[]sessions.LanguageInfo](t, out) {
		got[l.Language] = l
	}
	if py := got["python"]; py.Kernelspec != "python3" || py.Version == nil || !strings.HasPrefix(*py.Version, "3.") {
		t.Errorf("python: %s", out)
	}
	if ts, ok := got["typescript"]; !ok || ts.Kernelspec != "deno" {
		t.Errorf("typescript: %s", out)
	}
}

// mustRoot opens dir as a workspace root that a sandbox user can reach.
func mustRoot(t *testing.T, dir string) *workspace.Root {
	t.Helper()
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	r, err := workspace.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// memStatus reads VmRSS and VmHWM (peak) of this process, in bytes.
func memStatus(t *testing.T) (rss, hwm int64) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		needs.Skip(t, "no /proc: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		var kb int64
		if n, _ := fmt.Sscanf(line, "VmRSS: %d kB", &kb); n == 1 {
			rss = kb << 10
		}
		if n, _ := fmt.Sscanf(line, "VmHWM: %d kB", &kb); n == 1 {
			hwm = kb << 10
		}
	}
	return rss, hwm
}

// TestFilesOneGiBStreamed uploads and downloads 1 GiB (the default
// --max-upload) and checks that neither sits in memory: the peak RSS of
// this process, which holds the gateway and the client, grows by less
// than 32 MiB. The bytes are checked by their SHA-256 both ways.
func TestFilesOneGiBStreamed(t *testing.T) {
	if testing.Short() {
		t.Skip("1 GiB through the gateway")
	}
	g := newGateway(t)
	ctx := b4Context(t, g, map[string]any{"id": "big"})
	const size = 1 << 30
	block := make([]byte, 1<<20)
	rand.Read(block)

	runtime.GC()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Fatalf("cannot reset the peak RSS: %v", err)
	}
	_, rss0 := memStatus(t) // the peak, reset to the RSS of now
	sent := sha256.New()
	body := io.TeeReader(io.LimitReader(&repeatReader{block: block}, size), sent)
	req, _ := http.NewRequest("PUT", g.url+"/api/contexts/big/files/big.bin", body)
	req.ContentLength = size
	req.Header.Set("Authorization", "Bearer "+g.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || decode[fileModel](t, out).Size != size {
		t.Fatalf("upload: %d %s", resp.StatusCode, out)
	}
	if fi, err := os.Stat(filepath.Join(ctx.Cwd, "big.bin")); err != nil || fi.Size() != size {
		t.Fatalf("on disk: %v %v", fi, err)
	}

	req, _ = http.NewRequest("GET", g.url+"/api/contexts/big/files/big.bin", nil)
	req.Header.Set("Authorization", "Bearer "+g.token)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got := sha256.New()
	n, err := io.Copy(got, resp.Body)
	resp.Body.Close()
	if err != nil || n != size || resp.Header.Get("Content-Length") != fmt.Sprint(size) {
		t.Fatalf("download: %d bytes, %v, Content-Length %s", n, err, resp.Header.Get("Content-Length"))
	}
	if !bytes.Equal(sent.Sum(nil), got.Sum(nil)) {
		t.Fatal("the downloaded bytes differ from those uploaded")
	}
	_, hwm := memStatus(t)
	growth := hwm - rss0
	t.Logf("peak RSS growth over a 1 GiB upload and download: %.1f MiB", float64(growth)/(1<<20))
	if growth >= 32<<20 {
		t.Errorf("peak RSS grew by %.1f MiB (limit 32 MiB): the file passed through memory", float64(growth)/(1<<20))
	}
}

// repeatReader yields its block over and over.
type repeatReader struct {
	block []byte
	off   int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	n := copy(p, r.block[r.off:])
	r.off = (r.off + n) % len(r.block)
	return n, nil
}

// TestContextsShareAWorkspace: contexts made on a workspace of an adapter's
// (CreateWorkspace) see each other's files, and their deletion keeps it.
func TestContextsShareAWorkspace(t *testing.T) {
	g := newGateway(t)
	ws, err := g.mgr.CreateWorkspace("sandboxes/s1", "python")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.mgr.CreateWorkspace("contexts/x", "python"); err == nil {
		t.Error("a workspace was made among the contexts' own")
	}
	bg := context.Background()
	py, err := g.mgr.CreateContext(bg, sessions.ContextRequest{ID: "s1-py", Workspace: ws})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.mgr.CreateContext(bg, sessions.ContextRequest{ID: "s1-ts", Language: "typescript", Workspace: ws}); err != nil {
		t.Fatal(err)
	}
	if py.Workspace() != ws || py.Model().Cwd != ws.Dir() {
		t.Errorf("context cwd %s, workspace %s", py.Model().Cwd, ws.Dir())
	}
	mustRun(t, g, map[string]any{"context": "s1-py", "code": "open('from-python.txt', 'w').write('py')"})
	e := mustRun(t, g, map[string]any{"context": "s1-ts", "language": "typescript", "code": `console.log(Deno.readTextFileSync("from-python.txt"))`})
	if got := strings.TrimSpace(stdoutOf(e)); got != "py" {
		t.Errorf("TypeScript read %q", got)
	}
	for _, id := range []string{"s1-py", "s1-ts"} {
		if err := g.mgr.DeleteContext(bg, id); err != nil {
			t.Fatal(err)
		}
	}
	if !ws.Exists("from-python.txt") {
		t.Error("deleting a context removed the workspace it shared")
	}
	if err := ws.Delete(); err != nil {
		t.Fatal(err)
	}
}

// TestDenoPackagesOnCreate: a Deno context's packages are imported (and so
// cached in its workspace) before the answer; one that cannot be fetched
// is BAD_REQUEST naming it, and leaves no context.
func TestDenoPackagesOnCreate(t *testing.T) {
	g := newGateway(t)
	status, out := g.do("POST", "/api/contexts", map[string]any{"id": "dp", "language": "typescript", "packages": []string{"npm:kg-no-such-package-xyz@1"}})
	if body := decode[map[string]string](t, out); status != 400 || !strings.Contains(body["message"], "kg-no-such-package-xyz") {
		t.Errorf("failed import: %d %s", status, out)
	}
	if status, _ := g.do("GET", "/api/contexts/dp", nil); status != 404 {
		t.Errorf("a context whose packages failed exists: %d", status)
	}
	if status, out := g.do("POST", "/api/contexts", map[string]any{"language": "typescript", "packages": []string{"lodash"}}); status != 400 {
		t.Errorf("a bare name for Deno: %d %s", status, out)
	}
}

// TestPackagesSandboxed: with --sandbox, packages install into the
// context's workspace (writable by the sandbox user) and import there.
func TestPackagesSandboxed(t *testing.T) {
	b4NeedSandbox(t)
	wheels := b4HostDir(t)
	os.Chmod(wheels, 0o755)
	wheel(t, wheels, "kgsandboxed", "1.0", "'in the sandbox'")
	g := newGateway(t, b4Sandboxed(local.SandboxConfig{}), func(m *sessions.Config, _ *Config) {
		m.Workspaces = mustRoot(t, b4HostDir(t))
		m.PipFindLinks, m.PipNoIndex = []string{wheels}, true
	})
	ctx := b4Context(t, g, map[string]any{"id": "sbp", "packages": []string{"kgsandboxed"}})
	e := mustRun(t, g, map[string]any{"context": "sbp", "code": "import kgsandboxed, numpy; print(kgsandboxed.VALUE, kgsandboxed.__file__.startswith(" + fmt.Sprintf("%q", ctx.Cwd+"/.local/") + "))"})
	if got := strings.TrimSpace(stdoutOf(e)); got != "in the sandbox True" {
		t.Errorf("sandboxed import: %q", got)
	}
}

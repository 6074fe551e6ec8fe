package gateway

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"
)

// escapeFilePath is a listed path as a URL path: each element escaped.
func escapeFilePath(p string) string {
	parts := strings.Split(p, "/")
	for i, el := range parts {
		parts[i] = url.PathEscape(el)
	}
	return strings.Join(parts, "/")
}

// namesCode makes files whose names are not UTF-8 or hold a backslash.
const namesCode = `
import os
open(b'bad\xffname.txt', 'wb').write(b'one')
open('back\\slash.txt', 'w').write('two')
os.makedirs(b'd\xfe', exist_ok=True)
open(b'd\xfe/in\x80.txt', 'wb').write(b'three')
`

// TestFilesNamesNotUTF8RoundTrip: files a kernel names with bytes that
// are not UTF-8, or with a backslash, are listed with \xHH escapes, and
// each listed path downloads, lists and deletes its file, on the REST
// routes, MCP's read_file and list_files, and the E2B files API.
func TestFilesNamesNotUTF8RoundTrip(t *testing.T) {
	g := newGateway(t)
	b4Context(t, g, map[string]any{"id": "names"})
	mustRun(t, g, map[string]any{"context": "names", "code": namesCode})
	want := map[string]string{ // listed path → content
		`bad\xffname.txt`:   "one",
		`back\x5cslash.txt`: "two",
		`d\xfe/in\x80.txt`:  "three",
	}

	status, out := g.do("GET", "/api/contexts/names/files?recursive=true", nil)
	if status != 200 {
		t.Fatalf("listing: %d %s", status, out)
	}
	listed := map[string]fileModel{}
	for _, f := range decode[[]fileModel](t, out) {
		listed[f.Path] = f
	}
	if f := listed[`d\xfe`]; f.Type != "dir" || f.Name != `d\xfe` {
		t.Errorf(`d\xfe listed as %+v in %s`, f, out)
	}
	if status, out := g.do("GET", "/api/contexts/names/files?path="+url.QueryEscape(`d\xfe`), nil); status != 200 || !strings.Contains(string(out), `"d\\xfe/in\\x80.txt"`) {
		t.Errorf(`listing d\xfe: %d %s`, status, out)
	}
	for p, content := range want {
		f, ok := listed[p]
		if !ok || !utf8.ValidString(f.Path) {
			t.Errorf("%s not listed: %s", p, out)
			continue
		}
		resp, body := g.get("names", escapeFilePath(p), nil)
		if resp.StatusCode != 200 || string(body) != content {
			t.Errorf("GET %s: %d %q", p, resp.StatusCode, body)
		}
	}

	// MCP: the paths list_files shows are the ones read_file takes.
	cs, err := mcpClient(t, g, "Bearer "+g.token)
	if err != nil {
		t.Fatal(err)
	}
	res := call(t, cs, "list_files", map[string]any{"context": "names"})
	if got := texts(res); res.IsError || !strings.Contains(got, `bad\xffname.txt`) || !strings.Contains(got, `back\x5cslash.txt`) {
		t.Errorf("list_files = %q", got)
	}
	for p, content := range want {
		if res := call(t, cs, "read_file", map[string]any{"context": "names", "path": p}); res.IsError || texts(res) != content+"\n" {
			t.Errorf("read_file %s = %v %q", p, res.IsError, texts(res))
		}
	}

	// DELETE by the listed path removes the file.
	for p := range want {
		if status, out := g.do("DELETE", "/api/contexts/names/files/"+escapeFilePath(p), nil); status != 204 {
			t.Errorf("DELETE %s: %d %s", p, status, out)
		}
	}
	e := mustRun(t, g, map[string]any{"context": "names", "code": "import os; print(sorted(os.listdir(b'.')), os.listdir(b'd\\xfe'))"})
	if got := strings.TrimSpace(stdoutOf(e)); strings.Contains(got, "txt") {
		t.Errorf("after deleting every file the kernel sees %s", got)
	}

	// E2B: the same names in a sandbox.
	sandbox, token := e2bSandbox(t, g, `{}`)
	sbx := map[string]string{"E2b-Sandbox-Id": sandbox, "X-Access-Token": token}
	if status, out := g.doWith("POST", "/e2b/execute", map[string]string{"code": namesCode}, sbx); status != http.StatusOK || strings.Contains(string(out), `"error"`) {
		t.Fatalf("files in the sandbox: %d %s", status, out)
	}
	status, out = g.doWith("POST", "/e2b/filesystem.Filesystem/ListDir", map[string]any{"path": "/home/user", "depth": 2}, sbx)
	if status != 200 {
		t.Fatalf("ListDir: %d %s", status, out)
	}
	rpc := decode[struct {
		Entries []struct{ Path, Name string }
	}](t, out)
	paths := map[string]bool{}
	for _, e := range rpc.Entries {
		paths[e.Path] = true
	}
	for p, content := range want {
		abs := "/home/user/" + p
		if !paths[abs] {
			t.Errorf("ListDir lacks %s: %s", abs, out)
		}
		if status, body := g.doWith("GET", "/e2b/files?path="+url.QueryEscape(abs), nil, sbx); status != 200 || string(body) != content {
			t.Errorf("E2B GET %s: %d %q", abs, status, body)
		}
		if status, out := g.doWith("POST", "/e2b/filesystem.Filesystem/Remove", map[string]any{"path": abs}, sbx); status != 200 {
			t.Errorf("E2B Remove %s: %d %s", abs, status, out)
		}
	}
}

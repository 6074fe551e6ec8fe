package e2b

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http/httptest"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kernelgate/workspace"
)

// fileSandbox is a sandbox with a workspace of its own and no kernel, and
// a handler to serve its files.
func fileSandbox(t *testing.T) (*Handler, *sandbox) {
	t.Helper()
	root, err := workspace.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	ws, err := root.Create("sb", nil)
	if err != nil {
		t.Fatal(err)
	}
	h := &Handler{cfg: Config{MaxUploadBytes: 1 << 20, Describe: func(err error) (int, string) { return 500, err.Error() }}}
	return h, &sandbox{ws: ws}
}

// filePart is a part of a multipart upload, its Content-Disposition
// written as Node's fetch (undici) writes it: the name between quotes,
// as it is; or cd when set.
type filePart struct{ form, name, data, cd string }

func multipartBody(t *testing.T, parts []filePart) (string, *bytes.Buffer) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, p := range parts {
		hdr := textproto.MIMEHeader{}
		hdr.Set("Content-Disposition", fmt.Sprintf(`form-data; name=%q; filename="%s"`, p.form, p.name))
		if p.cd != "" {
			hdr.Set("Content-Disposition", p.cd)
		}
		hdr.Set("Content-Type", "application/octet-stream")
		w, err := mw.CreatePart(hdr)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(p.data))
	}
	mw.Close()
	return mw.FormDataContentType(), &body
}

// The SDK's files.write: several files in one multipart form, each at the
// whole path its part names; a single file at the query's path; bytes as
// application/octet-stream. Absolute paths outside the sandbox's home,
// "..", a path twice in one upload and backslashes are 400.
func TestPostFile(t *testing.T) {
	for _, c := range []struct {
		name   string
		query  string
		parts  []filePart // nil: the body is "raw" as application/octet-stream
		status int
		want   map[string]string // the workspace's files after it
		paths  []string          // the answer's paths
		msg    string            // in the error's message
	}{
		{name: "several files keep their folders", parts: []filePart{
			{"file", "/home/user/sub/dir/a.csv", "one", ""}, {"file", "other/b.csv", "two", ""}, {"file", "a.csv", "three", ""}},
			status: 200, want: map[string]string{"sub/dir/a.csv": "one", "other/b.csv": "two", "a.csv": "three"},
			paths: []string{"/home/user/sub/dir/a.csv", "/home/user/other/b.csv", "/home/user/a.csv"}},
		{name: "a name outside the workspace", parts: []filePart{{"file", "/etc/x", "x", ""}},
			status: 400, want: map[string]string{}, msg: "outside the sandbox"},
		{name: "dot-dot", parts: []filePart{{"file", "../x", "x", ""}}, status: 400, want: map[string]string{}},
		{name: "dot-dot under home", parts: []filePart{{"file", "/home/user/../x", "x", ""}}, status: 400, want: map[string]string{}},
		{name: "a backslash", parts: []filePart{{"file", `dir\x.csv`, "x", ""}}, status: 400, want: map[string]string{}, msg: "backslash"},
		{name: "an encoded name", parts: []filePart{{cd: `form-data; name="file"; filename*=UTF-8''%2E%2E%2Fx`, data: "x"}},
			status: 400, want: map[string]string{}},
		{name: "an encoded name inside", parts: []filePart{{cd: `form-data; name="file"; filename*=UTF-8''r%C3%A9p%2Fa.txt`, data: "a"}},
			status: 200, want: map[string]string{"rép/a.txt": "a"}, paths: []string{"/home/user/rép/a.txt"}},
		{name: "not form-data", parts: []filePart{{cd: `attachment; filename="a.txt"`, data: "a"}}, status: 400, want: map[string]string{}},
		{name: "a bad path after a good one", parts: []filePart{{"file", "ok.txt", "ok", ""}, {"file", "/tmp/x", "x", ""}},
			status: 400, want: map[string]string{"ok.txt": "ok"}, msg: "written before it: /home/user/ok.txt"},
		{name: "one path twice", parts: []filePart{{"file", "/home/user/same.txt", "first", ""}, {"file", "same.txt", "second", ""}},
			status: 400, want: map[string]string{"same.txt": "first"}, msg: "twice"},
		{name: "names beyond ASCII", parts: []filePart{{"file", "données/été.csv", "é", ""}},
			status: 200, want: map[string]string{"données/été.csv": "é"}, paths: []string{"/home/user/données/été.csv"}},
		{name: "other form fields are not files", parts: []filePart{{"meta", "ignored.txt", "x", ""}, {"file", "kept.txt", "k", ""}},
			status: 200, want: map[string]string{"kept.txt": "k"}, paths: []string{"/home/user/kept.txt"}},
		{name: "one file at the query's path", query: "/home/user/data/in.csv", parts: []filePart{{"file", "/home/user/data/in.csv", "a,b", ""}},
			status: 200, want: map[string]string{"data/in.csv": "a,b"}, paths: []string{"/home/user/data/in.csv"}},
		{name: "the query's path wins", query: "notes.txt", parts: []filePart{{"file", "blob", "n", ""}},
			status: 200, want: map[string]string{"notes.txt": "n"}, paths: []string{"/home/user/notes.txt"}},
		{name: "octet-stream", query: "/home/user/raw/r.bin", status: 200,
			want: map[string]string{"raw/r.bin": "raw"}, paths: []string{"/home/user/raw/r.bin"}},
		{name: "octet-stream outside", query: "/etc/passwd", status: 400, want: map[string]string{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, sb := fileSandbox(t)
			ct, body := "application/octet-stream", bytes.NewBufferString("raw")
			if c.parts != nil {
				ct, body = multipartBody(t, c.parts)
			}
			r := httptest.NewRequest("POST", "/files?path="+url.QueryEscape(c.query), body)
			r.Header.Set("Content-Type", ct)
			rec := httptest.NewRecorder()
			h.postFile(rec, r, sb)
			if rec.Code != c.status || !strings.Contains(rec.Body.String(), c.msg) {
				t.Fatalf("status %d %s; want %d with %q", rec.Code, rec.Body, c.status, c.msg)
			}
			if c.status == 200 {
				var out []writeEntry
				json.Unmarshal(rec.Body.Bytes(), &out)
				var paths []string
				for _, e := range out {
					paths = append(paths, e.Path)
				}
				if strings.Join(paths, " ") != strings.Join(c.paths, " ") {
					t.Errorf("answer paths %v, want %v", paths, c.paths)
				}
			}
			got := map[string]string{}
			filepath.WalkDir(sb.ws.Dir(), func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					b, _ := os.ReadFile(p)
					rel, _ := filepath.Rel(sb.ws.Dir(), p)
					got[filepath.ToSlash(rel)] = string(b)
				}
				return nil
			})
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("workspace holds %v, want %v", got, c.want)
			}
		})
	}
}

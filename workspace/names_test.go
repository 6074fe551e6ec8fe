package workspace

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestNonUTF8NamesRoundTrip: names that are not UTF-8, or hold a
// backslash, are listed with \xHH escapes, and every listed path reads,
// stats and removes the entry it names.
func TestNonUTF8NamesRoundTrip(t *testing.T) {
	_, w := newWorkspace(t)
	files := map[string]string{ // on disk → listed
		"bad\xffname.txt":   `bad\xffname.txt`,
		`back\slash.txt`:    `back\x5cslash.txt`,
		"caf\xc3\xa9.txt":   "café.txt",
		"d\xfe/in\x80.txt":  `d\xfe/in\x80.txt`,
		"mixed\xe2\x82.txt": `mixed\xe2\x82.txt`, // a cut-off UTF-8 sequence
	}
	for disk := range files {
		p := filepath.Join(w.Dir(), disk)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte("content of "+disk), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	list, err := w.List("", true)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]Entry{}
	for _, e := range list {
		if !utf8.ValidString(e.Path) || !utf8.ValidString(e.Name) {
			t.Errorf("listed %q: not UTF-8", e.Path)
		}
		listed[e.Path] = e
	}
	if e := listed[`d\xfe`]; e.Type != "dir" || e.Name != `d\xfe` {
		t.Errorf(`d\xfe listed as %+v`, e)
	}
	for disk, want := range files {
		e, ok := listed[want]
		if !ok {
			t.Errorf("%q not listed as %s: %v", disk, want, list)
			continue
		}
		if e.Name != want[strings.LastIndexByte(want, '/')+1:] {
			t.Errorf("%s named %q", want, e.Name)
		}
		f, fe, err := w.Open(e.Path)
		if err != nil {
			t.Errorf("Open(%s): %v", e.Path, err)
			continue
		}
		b, _ := io.ReadAll(f)
		f.Close()
		if string(b) != "content of "+disk || fe.Path != want {
			t.Errorf("Open(%s) read %q, entry %+v", e.Path, b, fe)
		}
		if st, err := w.Stat(e.Path); err != nil || st.Path != want {
			t.Errorf("Stat(%s) = %+v %v", e.Path, st, err)
		}
		if err := w.Remove(e.Path, false); err != nil {
			t.Errorf("Remove(%s): %v", e.Path, err)
		}
		if _, err := os.Lstat(filepath.Join(w.Dir(), disk)); !os.IsNotExist(err) {
			t.Errorf("%q still on disk after Remove(%s)", disk, want)
		}
	}
	// A write by an escaped path makes the name it stands for.
	e, err := w.Write(`new\xff\x5c.txt`, strings.NewReader("x"), 0)
	if err != nil || e.Path != `new\xff\x5c.txt` {
		t.Fatalf("Write = %+v %v", e, err)
	}
	if _, err := os.Stat(filepath.Join(w.Dir(), "new\xff\\.txt")); err != nil {
		t.Errorf("the escaped name on disk: %v", err)
	}
	// The raw bytes (a URL's %FF) name the same file.
	if _, err := w.Stat("new\xff\\x5c.txt"); err != nil {
		t.Errorf("Stat by raw bytes: %v", err)
	}
}

// TestCleanPathEscapes: an escape never makes a separator, a NUL, a ".."
// or an empty name, and a backslash is only ever an escape.
func TestCleanPathEscapes(t *testing.T) {
	for in, want := range map[string]string{
		`a\x41`:      "aA",
		`\xff`:       "\xff",
		`d\xFE/f`:    "d\xfe/f",
		`a\x5cb`:     `a\b`,
		"raw\xff":    "raw\xff",
		`x\x2e\x2ey`: "x..y",
	} {
		if got, err := CleanPath(in); err != nil || got != want {
			t.Errorf("CleanPath(%q) = %q %v, want %q", in, got, err, want)
		}
	}
	for _, in := range []string{`a\x2fb`, `a\x00`, `\x2e\x2e`, `\x2e`, `a/\x2e\x2e/b`, `a\b`, `a\`, `a\x`, `a\x4`, `a\xzz`, `a\\`, `..\x2f`} {
		if got, err := CleanPath(in); !errors.Is(err, ErrBadPath) {
			t.Errorf("CleanPath(%q) = %q %v, want ErrBadPath", in, got, err)
		}
	}
	for _, raw := range []string{"plain", "bad\xff", `a\b`, "\xc3", "é\x80é", "\x00x"} {
		if got, err := CleanPath(escape(raw)); raw != "\x00x" && (err != nil || got != raw) {
			t.Errorf("round trip of %q: %q %v", raw, got, err)
		}
	}
}

// FuzzEscapeRoundTrip: every name on disk is listed as valid UTF-8 that
// CleanPath turns back into the same name.
func FuzzEscapeRoundTrip(f *testing.F) {
	for _, s := range []string{"a", "bad\xff", `a\b`, "é", "\xed\xa0\x80", `\x41`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if raw == "" || raw == "." || raw == ".." || strings.ContainsAny(raw, "/\x00") || len(raw) > maxName {
			return
		}
		p := escape(raw)
		if !utf8.ValidString(p) {
			t.Fatalf("escape(%q) = %q: not UTF-8", raw, p)
		}
		if got, err := CleanPath(p); err != nil || got != raw {
			t.Fatalf("CleanPath(escape(%q)) = %q %v", raw, got, err)
		}
	})
}

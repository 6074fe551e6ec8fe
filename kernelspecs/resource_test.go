package kernelspecs

import (
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// resourceTree builds root/kernels/py (the spec under test) beside
// root/kernels/other and root/outside, and returns the parsed py spec.
func resourceTree(t testing.TB) *Spec {
	t.Helper()
	root := t.TempDir()
	dir := writeSpec(t, filepath.Join(root, "kernels"), "py", `{"argv": ["py"], "display_name": "Py", "language": "python"}`)
	writeSpec(t, filepath.Join(root, "kernels"), "other", `{"argv": ["other"], "display_name": "Other", "language": "x"}`)
	outside := filepath.Join(root, "outside")
	for _, d := range []string{outside, filepath.Join(dir, "sub", "dir")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := []string{
		"logo-32x32.png", "logo-64x64.png", "logo-64x64.svg", "logo-svg.svg", "logo-extra.SVG",
		"logo-notes.txt", "kernel.js", "kernel.css", "README.md", "%2e%2e", "sub/inner.txt",
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(f)), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{
		"link-in":        "logo-64x64.png",
		"sub/link-up":    "../kernel.json",
		"link-out":       filepath.Join(outside, "secret.txt"),
		"logo-out.png":   filepath.Join(outside, "secret.txt"),
		"link-rel-out":   "../other/kernel.json",
		"linkdir-out":    outside,
		"link-dangling":  "nowhere",
		"link-self-dir":  ".",
		"sub/link-loop1": "link-loop2",
		"sub/link-loop2": "link-loop1",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, filepath.FromSlash(name))); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Parse(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestResources(t *testing.T) {
	s := resourceTree(t)
	want := map[string]string{
		"logo-32x32": "logo-32x32.png",
		"logo-64x64": "logo-64x64.png", // before logo-64x64.svg in name order
		"logo-svg":   "logo-svg.svg",
		"logo-extra": "logo-extra.SVG",
		"kernel.js":  "kernel.js",
		"kernel.css": "kernel.css",
	}
	if !maps.Equal(s.Resources, want) {
		t.Errorf("Resources = %v\nwant %v", s.Resources, want)
	}
}

func TestResourcePath(t *testing.T) {
	s := resourceTree(t)
	tests := []struct {
		file string
		ok   bool
	}{
		{"logo-64x64.png", true},
		{"kernel.json", true},
		{"sub/inner.txt", true},
		{"link-in", true},
		{"sub/link-up", true}, // resolves to kernel.json, still inside
		{"%2e%2e", true},      // a literal file name, not a parent reference

		{"../other/kernel.json", false},
		{"../py/kernel.json", false},
		{"sub/../kernel.json", false},
		{"./kernel.json", false},
		{"sub//inner.txt", false},
		{"kernel.json/", false},
		{"%2e%2e/other/kernel.json", false},
		{"..%2fother%2fkernel.json", false},
		{"..", false},
		{".", false},
		{"", false},
		{"/etc/passwd", false},
		{filepath.ToSlash(filepath.Join(s.Dir, "kernel.json")), false},
		{`sub\inner.txt`, false},
		{`..\other\kernel.json`, false},
		{"kernel.json\x00", false},
		{"missing.png", false},
		{"link-out", false},
		{"logo-out.png", false},
		{"link-rel-out", false},
		{"linkdir-out/secret.txt", false},
		{"link-dangling", false},
		{"link-self-dir", false},
		{"sub/link-loop1", false},
		{"sub", false},
		{"sub/dir", false},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, err := s.ResourcePath(tt.file)
			if tt.ok {
				want := filepath.Join(s.Dir, filepath.FromSlash(tt.file))
				if err != nil || got != want {
					t.Errorf("ResourcePath = %q, %v; want %q", got, err, want)
				}
				return
			}
			if err == nil || got != "" {
				t.Fatalf("ResourcePath = %q, %v; want an error", got, err)
			}
			if !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("ResourcePath error = %v, want one wrapping fs.ErrNotExist", err)
			}
		})
	}

	t.Run("no dir", func(t *testing.T) {
		for _, s := range []*Spec{{}, {Dir: "relative"}} {
			if p, err := s.ResourcePath("kernel.json"); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("Spec{Dir: %q}.ResourcePath = %q, %v; want fs.ErrNotExist", s.Dir, p, err)
			}
		}
	})
}

func FuzzResourcePath(f *testing.F) {
	s := resourceTree(f)
	root, err := filepath.EvalSymlinks(s.Dir)
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		"logo-64x64.png", "kernel.json", "sub/inner.txt", "sub/link-up", "link-in", "%2e%2e",
		"../other/kernel.json", "..", "/etc/passwd", "link-out", "linkdir-out/secret.txt",
		"link-rel-out", `sub\..\..\other`, "a\x00b", "", ".", "sub/dir", "//x", "sub/./inner.txt",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, file string) {
		p, err := s.ResourcePath(file)
		if err != nil {
			if p != "" || !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("ResourcePath(%q) = %q, %v; want \"\" and fs.ErrNotExist", file, p, err)
			}
			return
		}
		if !strings.HasPrefix(p, s.Dir+string(filepath.Separator)) {
			t.Fatalf("ResourcePath(%q) = %q, not below %q", file, p, s.Dir)
		}
		resolved, err := filepath.EvalSymlinks(p)
		if err != nil {
			t.Fatalf("ResourcePath(%q) = %q, which does not resolve: %v", file, p, err)
		}
		if !strings.HasPrefix(resolved, root+string(filepath.Separator)) {
			t.Fatalf("ResourcePath(%q) = %q resolves to %q, outside %q", file, p, resolved, root)
		}
		if fi, err := os.Stat(resolved); err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("ResourcePath(%q) = %q, not a regular file (%v)", file, p, err)
		}
	})
}

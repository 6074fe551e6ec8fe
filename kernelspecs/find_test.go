package kernelspecs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestLoad(t *testing.T) {
	spec := func(display string) string {
		return `{"argv": ["k", "{connection_file}"], "display_name": "` + display + `", "language": "k"}`
	}
	root := t.TempDir()
	a := filepath.Join(root, "a")
	b := filepath.Join(root, "b")
	missing := filepath.Join(root, "missing")
	notDir := filepath.Join(root, "file")

	writeSpec(t, a, "python3", spec("A python"))
	writeSpec(t, a, "broken", `{"argv": [`)
	writeSpec(t, a, "Upper", spec("bad name"))
	if err := os.MkdirAll(filepath.Join(a, "no-kernel-json"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a, "README"), []byte("not a spec"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "nowhere"), filepath.Join(a, "dangling")); err != nil {
		t.Fatal(err)
	}
	writeSpec(t, b, "python3", spec("B python"))
	writeSpec(t, b, "broken", spec("B broken is shadowed"))
	writeSpec(t, b, "zeta", spec("Zeta"))
	writeSpec(t, b, "deno", spec("Deno"))
	linked := writeSpec(t, filepath.Join(root, "elsewhere"), "linked", spec("Linked"))
	if err := os.Symlink(linked, filepath.Join(b, "linked")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	dirs := []string{a, missing, b, notDir}
	c := Load(dirs)

	t.Run("names sorted", func(t *testing.T) {
		want := []string{"deno", "linked", "python3", "zeta"}
		if got := c.Names(); !slices.Equal(got, want) {
			t.Errorf("Names = %q, want %q", got, want)
		}
		var all []string
		for _, s := range c.All() {
			all = append(all, s.Name)
		}
		if !slices.Equal(all, want) {
			t.Errorf("All names = %q, want %q", all, want)
		}
	})
	t.Run("first match wins", func(t *testing.T) {
		s, err := c.Get("python3")
		if err != nil {
			t.Fatal(err)
		}
		if s.DisplayName != "A python" || s.Dir != filepath.Join(a, "python3") {
			t.Errorf("python3 = %q in %s, want the one in %s", s.DisplayName, s.Dir, a)
		}
	})
	t.Run("broken spec shadows later one", func(t *testing.T) {
		if _, err := c.Get("broken"); !errors.Is(err, ErrNoSuchSpec) {
			t.Errorf("Get(broken) error = %v, want ErrNoSuchSpec", err)
		}
	})
	t.Run("get is case-insensitive", func(t *testing.T) {
		if s, err := c.Get("PYTHON3"); err != nil || s.Name != "python3" {
			t.Errorf("Get(PYTHON3) = %v, %v", s, err)
		}
	})
	t.Run("unknown name", func(t *testing.T) {
		_, err := c.Get("nope")
		if !errors.Is(err, ErrNoSuchSpec) || !strings.Contains(err.Error(), "nope") {
			t.Errorf("Get(nope) error = %v, want ErrNoSuchSpec naming it", err)
		}
	})
	t.Run("problems", func(t *testing.T) {
		want := []struct {
			path string
			is   error
		}{
			{filepath.Join(a, "Upper", specFile), ErrInvalid},
			{filepath.Join(a, "broken", specFile), ErrInvalid},
			{filepath.Join(a, "dangling"), fs.ErrNotExist},
			{notDir, nil},
		}
		got := c.Problems()
		if len(got) != len(want) {
			t.Fatalf("Problems = %v, want %d", got, len(want))
		}
		for i, w := range want {
			if got[i].Path != w.path || got[i].Err == nil || (w.is != nil && !errors.Is(got[i].Err, w.is)) {
				t.Errorf("Problems[%d] = %+v, want path %s wrapping %v", i, got[i], w.path, w.is)
			}
		}
	})
	t.Run("dirs", func(t *testing.T) {
		if got := c.Dirs(); !slices.Equal(got, dirs) {
			t.Errorf("Dirs = %q, want %q", got, dirs)
		}
	})
	t.Run("results are copies", func(t *testing.T) {
		c.Names()[0] = "x"
		c.Dirs()[0] = "x"
		if c.Names()[0] != "deno" || c.Dirs()[0] != a {
			t.Error("caller's change to a returned slice reached the catalog")
		}
	})
}

func TestLoadEmpty(t *testing.T) {
	tests := []struct {
		name string
		dirs []string
	}{
		{"no dirs", nil},
		{"missing dirs", []string{filepath.Join(t.TempDir(), "x"), filepath.Join(t.TempDir(), "y", "z")}},
		{"empty dir", []string{t.TempDir()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Load(tt.dirs)
			if len(c.Names()) != 0 || len(c.All()) != 0 || len(c.Problems()) != 0 {
				t.Errorf("Load(%q) = names %q, problems %v", tt.dirs, c.Names(), c.Problems())
			}
			if _, err := c.Get("python3"); !errors.Is(err, ErrNoSuchSpec) {
				t.Errorf("Get error = %v, want ErrNoSuchSpec", err)
			}
		})
	}
}

func TestLoadTestdata(t *testing.T) {
	c := Load([]string{filepath.Join("testdata", "kernels")})
	if len(c.Problems()) != 0 {
		t.Errorf("Problems = %v", c.Problems())
	}
	if want := []string{"deno", "python3", "sandboxed"}; !slices.Equal(c.Names(), want) {
		t.Errorf("Names = %q, want %q", c.Names(), want)
	}
}

func TestSearchPath(t *testing.T) {
	list := func(p ...string) string { return strings.Join(p, string(os.PathListSeparator)) }
	system := []string{"/usr/local/share/jupyter/kernels", "/usr/share/jupyter/kernels"}
	tests := []struct {
		name  string
		extra []string
		env   map[string]string
		want  []string
	}{
		{
			name: "nothing set",
			want: system,
		},
		{
			name:  "all sources, data dir set",
			extra: []string{"/extra/one", "/extra/two/"},
			env: map[string]string{
				"JUPYTER_PATH":     list("/jp1", "/jp2"),
				"JUPYTER_DATA_DIR": "/data",
				"XDG_DATA_HOME":    "/xdg",
				"HOME":             "/home/u",
			},
			want: append([]string{"/extra/one", "/extra/two", "/jp1/kernels", "/jp2/kernels", "/data/kernels"}, system...),
		},
		{
			name: "data dir unset uses HOME",
			env:  map[string]string{"JUPYTER_PATH": list("/jp1", "/jp2"), "HOME": "/home/u"},
			want: append([]string{"/jp1/kernels", "/jp2/kernels", "/home/u/.local/share/jupyter/kernels"}, system...),
		},
		{
			name: "data dir unset uses XDG_DATA_HOME",
			env:  map[string]string{"XDG_DATA_HOME": "/xdg", "HOME": "/home/u"},
			want: append([]string{"/xdg/jupyter/kernels"}, system...),
		},
		{
			name:  "duplicates removed, first kept",
			extra: []string{"/usr/share/jupyter/kernels", "", "/jp/kernels/"},
			env: map[string]string{
				"JUPYTER_PATH":     list("/usr/share/jupyter", "", "/jp", "/jp/", "/other"),
				"JUPYTER_DATA_DIR": "/other",
			},
			want: []string{"/usr/share/jupyter/kernels", "/jp/kernels", "/other/kernels", "/usr/local/share/jupyter/kernels"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := SearchPath(tt.extra, func(k string) string { return tt.env[k] })
			want := make([]string, len(tt.want))
			for i, w := range tt.want {
				want[i] = filepath.FromSlash(w)
			}
			if !slices.Equal(got, want) {
				t.Errorf("SearchPath = %q\nwant %q", got, want)
			}
		})
	}
}

package kernelspecs

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// writeSpec creates parent/name/kernel.json holding body and returns the spec dir.
func writeSpec(t testing.TB, parent, name, body string) string {
	t.Helper()
	dir := filepath.Join(parent, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, specFile), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestParse(t *testing.T) {
	dir := writeSpec(t, t.TempDir(), "py", `{
		"argv": ["python", "-f", "{connection_file}"],
		"display_name": "Py",
		"language": "python",
		"metadata": {"debugger": true, "cull_idle_timeout": 60, "nested": {"a": [1, "x"]}}
	}`)
	s, err := Parse(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := &Spec{
		Name:          "py",
		Dir:           dir,
		Argv:          []string{"python", "-f", "{connection_file}"},
		DisplayName:   "Py",
		Language:      "python",
		InterruptMode: InterruptSignal,
		Metadata: map[string]any{
			"debugger":          true,
			"cull_idle_timeout": float64(60),
			"nested":            map[string]any{"a": []any{float64(1), "x"}},
		},
		Resources: map[string]string{},
	}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("Parse = %+v\nwant %+v", s, want)
	}
}

func TestParseFields(t *testing.T) {
	const (
		argv = `"argv": ["k", "{connection_file}"]`
		dn   = `"display_name": "K"`
		lang = `"language": "k"`
	)
	obj := func(fields ...string) string { return "{" + strings.Join(fields, ", ") + "}" }
	tests := []struct {
		name  string
		body  string
		field string // "" means valid; otherwise the error must wrap ErrInvalid and name this
		check func(t *testing.T, s *Spec)
	}{
		{name: "minimal", body: obj(argv, dn, lang), check: func(t *testing.T, s *Spec) {
			if s.InterruptMode != InterruptSignal || s.Env != nil || s.Metadata != nil || s.ProtocolVersion != "" {
				t.Errorf("defaults: %+v", s)
			}
		}},
		{name: "all fields", body: obj(argv, dn, lang, `"interrupt_mode": "message"`, `"env": {"A": "1", "B": ""}`,
			`"metadata": {}`, `"kernel_protocol_version": "5.3"`), check: func(t *testing.T, s *Spec) {
			if s.InterruptMode != InterruptMessage || !maps.Equal(s.Env, map[string]string{"A": "1", "B": ""}) ||
				s.Metadata == nil || s.ProtocolVersion != "5.3" {
				t.Errorf("got %+v", s)
			}
		}},
		{name: "interrupt_mode signal", body: obj(argv, dn, lang, `"interrupt_mode": "signal"`), check: func(t *testing.T, s *Spec) {
			if s.InterruptMode != InterruptSignal {
				t.Errorf("InterruptMode = %q", s.InterruptMode)
			}
		}},
		{name: "interrupt_mode empty", body: obj(argv, dn, lang, `"interrupt_mode": ""`), check: func(t *testing.T, s *Spec) {
			if s.InterruptMode != InterruptSignal {
				t.Errorf("InterruptMode = %q", s.InterruptMode)
			}
		}},
		{name: "nulls are absent", body: obj(argv, dn, lang, `"interrupt_mode": null`, `"env": null`, `"metadata": null`,
			`"kernel_protocol_version": null`), check: func(t *testing.T, s *Spec) {
			if s.InterruptMode != InterruptSignal || s.Env != nil || s.Metadata != nil {
				t.Errorf("got %+v", s)
			}
		}},
		{name: "unknown fields ignored", body: obj(argv, dn, lang, `"future": {"x": 1}`)},

		{name: "missing argv", body: obj(dn, lang), field: "argv"},
		{name: "null argv", body: obj(`"argv": null`, dn, lang), field: "argv"},
		{name: "empty argv", body: obj(`"argv": []`, dn, lang), field: "argv"},
		{name: "argv not array", body: obj(`"argv": "k -f x"`, dn, lang), field: "argv"},
		{name: "argv element not string", body: obj(`"argv": ["k", 1]`, dn, lang), field: "argv[1]"},
		{name: "argv element null", body: obj(`"argv": ["k", null]`, dn, lang), field: "argv[1]"},
		{name: "argv element NUL", body: obj(`"argv": ["k", "a\u0000b"]`, dn, lang), field: "argv[1]"},
		{name: "empty argv[0]", body: obj(`"argv": ["", "x"]`, dn, lang), field: "argv[0]"},
		{name: "missing display_name", body: obj(argv, lang), field: "display_name"},
		{name: "blank display_name", body: obj(argv, `"display_name": "  "`, lang), field: "display_name"},
		{name: "display_name not string", body: obj(argv, `"display_name": 3`, lang), field: "display_name"},
		{name: "missing language", body: obj(argv, dn), field: "language"},
		{name: "empty language", body: obj(argv, dn, `"language": ""`), field: "language"},
		{name: "bad interrupt_mode", body: obj(argv, dn, lang, `"interrupt_mode": "sigint"`), field: "interrupt_mode"},
		{name: "interrupt_mode wrong case", body: obj(argv, dn, lang, `"interrupt_mode": "Signal"`), field: "interrupt_mode"},
		{name: "interrupt_mode not string", body: obj(argv, dn, lang, `"interrupt_mode": 2`), field: "interrupt_mode"},
		{name: "env value number", body: obj(argv, dn, lang, `"env": {"A": 1}`), field: "env"},
		{name: "env value null", body: obj(argv, dn, lang, `"env": {"A": null}`), field: "env"},
		{name: "env value object", body: obj(argv, dn, lang, `"env": {"A": {"b": "c"}}`), field: "env"},
		{name: "env not object", body: obj(argv, dn, lang, `"env": ["A=1"]`), field: "env"},
		{name: "env name with =", body: obj(argv, dn, lang, `"env": {"A=B": "1"}`), field: "env"},
		{name: "env empty name", body: obj(argv, dn, lang, `"env": {"": "1"}`), field: "env"},
		{name: "metadata not object", body: obj(argv, dn, lang, `"metadata": [1]`), field: "metadata"},
		{name: "protocol version not string", body: obj(argv, dn, lang, `"kernel_protocol_version": 5.3`), field: "kernel_protocol_version"},
		{name: "bad JSON", body: `{"argv": ["k"`, field: "unexpected end of JSON input"},
		{name: "trailing garbage", body: obj(argv, dn, lang) + "x", field: "invalid character"},
		{name: "JSON array", body: `[]`, field: "cannot unmarshal"},
		{name: "JSON null", body: `null`, field: "not a JSON object"},
		{name: "empty file", body: ``, field: "unexpected end of JSON input"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(writeSpec(t, t.TempDir(), "k", tt.body))
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if tt.check != nil {
					tt.check(t, s)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse error = %v, want one wrapping ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Errorf("Parse error %q does not mention %q", err, tt.field)
			}
			if s != nil {
				t.Errorf("Parse returned a spec with an error: %+v", s)
			}
		})
	}
}

func TestParseNames(t *testing.T) {
	const body = `{"argv": ["k"], "display_name": "K", "language": "k"}`
	tests := []struct {
		dir string
		ok  bool
	}{
		{"python3", true},
		{"py-3.11_x", true},
		{"Python3", false},
		{"my kernel", false},
		{"pythön", false},
		{"py:3", false},
	}
	for _, tt := range tests {
		t.Run(tt.dir, func(t *testing.T) {
			s, err := Parse(writeSpec(t, t.TempDir(), tt.dir, body))
			if tt.ok {
				if err != nil || s.Name != tt.dir {
					t.Errorf("Parse = %v, %v; want name %q", s, err, tt.dir)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "name") {
				t.Errorf("Parse error = %v, want a bad name wrapping ErrInvalid", err)
			}
		})
	}
}

func TestCheckName(t *testing.T) {
	for _, name := range []string{"", ".", "..", "../x", "a/b", `a\b`, "UPPER", "has space", "tab\t", "nul\x00"} {
		if err := checkName(name); !errors.Is(err, ErrInvalid) {
			t.Errorf("checkName(%q) = %v, want ErrInvalid", name, err)
		}
	}
	for _, name := range []string{"a", "python3", "ir", ".hidden", "a..b", "-x", "0"} {
		if err := checkName(name); err != nil {
			t.Errorf("checkName(%q) = %v", name, err)
		}
	}
}

func TestParseFileErrors(t *testing.T) {
	t.Run("missing kernel.json", func(t *testing.T) {
		_, err := Parse(t.TempDir())
		if !errors.Is(err, ErrNoSuchSpec) || !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrInvalid) {
			t.Errorf("Parse error = %v, want ErrNoSuchSpec and fs.ErrNotExist", err)
		}
	})
	t.Run("kernel.json is a directory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "k")
		if err := os.MkdirAll(filepath.Join(dir, specFile), 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := Parse(dir); !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse error = %v, want ErrInvalid", err)
		}
	})
	t.Run("kernel.json too large", func(t *testing.T) {
		body := `{"argv": ["k"], "display_name": "K", "language": "k"}` + strings.Repeat(" ", maxSpecSize)
		if _, err := Parse(writeSpec(t, t.TempDir(), "k", body)); !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse error = %v, want ErrInvalid", err)
		}
	})
	t.Run("relative dir made absolute", func(t *testing.T) {
		s, err := Parse(filepath.Join("testdata", "kernels", "python3"))
		if err != nil {
			t.Fatal(err)
		}
		if !filepath.IsAbs(s.Dir) || filepath.Base(s.Dir) != "python3" {
			t.Errorf("Dir = %q, want an absolute path ending in python3", s.Dir)
		}
	})
}

// TestParseGolden parses each spec under testdata/kernels and compares it,
// with Dir made relative, to testdata/golden/<name>.json.
func TestParseGolden(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join("testdata", "kernels", "*"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no sample kernelspecs: %v", err)
	}
	for _, dir := range dirs {
		name := filepath.Base(dir)
		t.Run(name, func(t *testing.T) {
			s, err := Parse(dir)
			if err != nil {
				t.Fatal(err)
			}
			view := *s
			view.Dir = filepath.ToSlash(dir)
			got, err := json.MarshalIndent(view, "", "\t")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			golden := filepath.Join("testdata", "golden", name+".json")
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("Parse(%s) differs from %s:\ngot:\n%s\nwant:\n%s", dir, golden, got, want)
			}
		})
	}
}

func TestCommand(t *testing.T) {
	vars := map[string]string{"HOME": "/home/u", "PATH": "/bin", "EMPTY": "", "_X1": "x"}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }

	t.Run("argv", func(t *testing.T) {
		s := &Spec{Dir: "/k/py", Argv: []string{
			"py", "-f", "{connection_file}", "--res={resource_dir}/x", "{prefix}", "{other}",
			"{connection_file}{connection_file}", "{ connection_file}", "$HOME",
		}}
		argv, env := s.Command("/run/c-{resource_dir}.json", lookup)
		want := []string{
			"py", "-f", "/run/c-{resource_dir}.json", "--res=/k/py/x", "{prefix}", "{other}",
			"/run/c-{resource_dir}.json/run/c-{resource_dir}.json", "{ connection_file}", "$HOME",
		}
		if !slices.Equal(argv, want) {
			t.Errorf("argv = %q\nwant %q", argv, want)
		}
		if env == nil || len(env) != 0 {
			t.Errorf("env = %v, want empty non-nil", env)
		}
	})

	tests := []struct{ in, want string }{
		{"plain", "plain"},
		{"${HOME}/x", "/home/u/x"},
		{"$HOME/x", "/home/u/x"},
		{"$PATH:/opt/bin", "/bin:/opt/bin"},
		{"${HOME}_DIR", "/home/u_DIR"},
		{"$HOME_DIR", ""}, // the longest name is HOME_DIR, which is unset
		{"$MISSING", ""},
		{"a${MISSING}b", "ab"},
		{"[$EMPTY]", "[]"},
		{"$_X1$_X1", "xx"},
		{"$$HOME", "$HOME"},
		{"$$", "$"},
		{"cost: 5$", "cost: 5$"},
		{"$1", "$1"},
		{"$ x", "$ x"},
		{"${unterminated", "${unterminated"},
		{"${}", "${}"},
		{"${1x}", "${1x}"},
		{"${a b}", "${a b}"},
		{"$}{HOME}", "$}{HOME}"},
	}
	for _, tt := range tests {
		t.Run("env "+tt.in, func(t *testing.T) {
			s := &Spec{Argv: []string{"k"}, Env: map[string]string{"V": tt.in}}
			if _, env := s.Command("c.json", lookup); env["V"] != tt.want {
				t.Errorf("expand(%q) = %q, want %q", tt.in, env["V"], tt.want)
			}
		})
	}

	t.Run("nil lookup", func(t *testing.T) {
		s := &Spec{Argv: []string{"k"}, Env: map[string]string{"V": "a$HOME${PATH}b"}}
		if _, env := s.Command("c.json", nil); env["V"] != "ab" {
			t.Errorf("env = %q, want %q", env["V"], "ab")
		}
	})

	t.Run("spec unchanged", func(t *testing.T) {
		s, err := Parse(filepath.Join("testdata", "kernels", "sandboxed"))
		if err != nil {
			t.Fatal(err)
		}
		before := *s
		before.Argv = slices.Clone(s.Argv)
		before.Env = maps.Clone(s.Env)
		argv, env := s.Command("/run/c.json", lookup)
		argv[0] = "changed"
		env["PYTHONPATH"] = "changed"
		env["NEW"] = "added"
		if !reflect.DeepEqual(*s, before) {
			t.Errorf("Command changed the spec:\n%+v\nwas\n%+v", *s, before)
		}
		if env["PYDEVD_DISABLE_FILE_VALIDATION"] != "1" {
			t.Errorf("env = %v", env)
		}
	})
}

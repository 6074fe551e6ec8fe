// Package testkernels gives tests the real kernelspecs that `make kernels`
// writes into .kernels/ at the root of the repository.
//
// KERNELGATE_ZYGOTE chooses how the python3 kernelspec's kernels start:
// "1" forks them from a zygote that has preloaded numpy, pandas and
// matplotlib (metadata.kernelgate.launcher "fork", preload), "0" execs
// each (launcher "exec"); unset, the kernelspec is used as written, and
// the provisioner's default applies.
package testkernels

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"kernelgate/kernelspecs"
)

// ZygoteEnv is the variable that switches the Python launcher of tests.
const ZygoteEnv = "KERNELGATE_ZYGOTE"

// Preload is what the python3 kernelspec's zygote imports under
// KERNELGATE_ZYGOTE=1.
var Preload = []string{"numpy", "pandas", "matplotlib"}

// Dir returns the directory of the test kernelspecs: .kernels at the root
// of the repository or, when KERNELGATE_ZYGOTE is set, a copy of it in a
// temporary directory of t with the python3 kernelspec's launcher set.
func Dir(t testing.TB) string {
	t.Helper()
	dir := repoKernels(t)
	switch os.Getenv(ZygoteEnv) {
	case "":
		return dir
	case "0":
		return WithLauncher(t, dir, "exec", nil)
	default:
		return WithLauncher(t, dir, "fork", Preload)
	}
}

func repoKernels(t testing.TB) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, ".kernels")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("testkernels: no go.mod above the test's directory")
		}
		dir = parent
	}
}

// WithLauncher copies the kernelspecs of dir into a temporary directory of
// t, setting the python3 kernelspec's metadata.kernelgate.launcher and,
// when given, its preload list.
func WithLauncher(t testing.TB, dir, launcher string, preload []string) string {
	t.Helper()
	out := t.TempDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if err := os.Mkdir(filepath.Join(out, e.Name()), 0o755); err != nil {
			t.Fatal(err)
		}
		files, _ := os.ReadDir(filepath.Join(dir, e.Name()))
		for _, f := range files {
			b, err := os.ReadFile(filepath.Join(dir, e.Name(), f.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if e.Name() == "python3" && f.Name() == "kernel.json" {
				b = setLauncher(t, b, launcher, preload)
			}
			if err := os.WriteFile(filepath.Join(out, e.Name(), f.Name()), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return out
}

func setLauncher(t testing.TB, b []byte, launcher string, preload []string) []byte {
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	md, _ := spec["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
	}
	kg, _ := md["kernelgate"].(map[string]any)
	if kg == nil {
		kg = map[string]any{}
	}
	kg["launcher"] = launcher
	if preload != nil {
		kg["preload"] = preload
	}
	md["kernelgate"] = kg
	spec["metadata"] = md
	out, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Spec returns the named kernelspec (python3 or deno) or fails the test
// with what to do.
func Spec(t testing.TB, name string) *kernelspecs.Spec {
	t.Helper()
	cat := kernelspecs.Load([]string{Dir(t)})
	s, err := cat.Get(name)
	if err != nil {
		t.Fatalf("kernelspec %s missing (%v): run `make kernels` first", name, err)
	}
	return s
}

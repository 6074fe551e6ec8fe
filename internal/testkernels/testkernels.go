// Package testkernels gives tests the real kernelspecs that `make kernels`
// writes into .kernels/ at the root of the repository.
package testkernels

import (
	"os"
	"path/filepath"
	"testing"

	"kernelgate/kernelspecs"
)

// Dir returns the .kernels directory of the repository.
func Dir(t testing.TB) string {
	t.Helper()
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

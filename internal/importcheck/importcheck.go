// Package importcheck lets a package's tests hold what its code imports.
package importcheck

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// StdlibOnly fails t if a non-test file of the package in the current
// folder imports anything outside the standard library; why says why the
// package keeps to it.
func StdlibOnly(t testing.TB, why string) {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") || first == "kernelgate" {
				t.Errorf("%s imports %s; %s", name, path, why)
			}
		}
	}
}

package sessions

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// No callback held by a Kernel runs under its life lock: start, restart
// and shutdown hold it for seconds, and a callback (code of another
// package) that waits on the kernel would deadlock it. The test reads the
// package's source: a function that takes k.life may not call a func
// value taken from one of Kernel's fields of func type (or a slice or map
// of them).
func TestNoKernelCallbackUnderLifeLock(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	files := pkgs["sessions"].Files
	callbacks := map[string]bool{} // Kernel's fields holding funcs
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || ts.Name.Name != "Kernel" {
				return true
			}
			for _, fld := range ts.Type.(*ast.StructType).Fields.List {
				if holdsFunc(fld.Type) {
					for _, name := range fld.Names {
						callbacks[name.Name] = true
					}
				}
			}
			return false
		})
	}
	if len(callbacks) == 0 {
		t.Fatal("found no field of Kernel holding funcs: the test reads the wrong source")
	}
	checked := 0
	for _, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil || !locksLife(fn.Body) {
				continue
			}
			checked++
			// Locals that hold a callback: x := k.field, x := k.field[i],
			// for _, x := range k.field.
			held := map[string]bool{}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.AssignStmt:
					for i, rhs := range n.Rhs {
						if i < len(n.Lhs) && callbackField(rhs, callbacks) {
							if id, ok := n.Lhs[i].(*ast.Ident); ok {
								held[id.Name] = true
							}
						}
					}
				case *ast.RangeStmt:
					if id, ok := n.Value.(*ast.Ident); ok && (callbackField(n.X, callbacks) || isHeld(n.X, held)) {
						held[id.Name] = true
					}
				}
				return true
			})
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				if callbackField(call.Fun, callbacks) || isHeld(call.Fun, held) {
					t.Errorf("%s: %s calls a callback of the kernel while it holds k.life", fset.Position(call.Pos()), fn.Name.Name)
				}
				return true
			})
		}
	}
	if checked == 0 {
		t.Fatal("no function takes k.life: the test reads the wrong source")
	}
}

// holdsFunc reports whether a field of type e holds funcs.
func holdsFunc(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.FuncType:
		return true
	case *ast.ArrayType:
		return holdsFunc(e.Elt)
	case *ast.MapType:
		return holdsFunc(e.Value)
	}
	return false
}

// locksLife reports whether body calls <x>.life.Lock().
func locksLife(body *ast.BlockStmt) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "Lock" {
			if inner, ok := sel.X.(*ast.SelectorExpr); ok && inner.Sel.Name == "life" {
				found = true
			}
		}
		return !found
	})
	return found
}

// callbackField reports whether e is <x>.field or <x>.field[i] for a
// field holding funcs.
func callbackField(e ast.Expr, callbacks map[string]bool) bool {
	if ix, ok := e.(*ast.IndexExpr); ok {
		e = ix.X
	}
	sel, ok := e.(*ast.SelectorExpr)
	return ok && callbacks[sel.Sel.Name]
}

func isHeld(e ast.Expr, held map[string]bool) bool {
	if ix, ok := e.(*ast.IndexExpr); ok {
		e = ix.X
	}
	id, ok := e.(*ast.Ident)
	return ok && held[id.Name]
}

package workspace

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func deepPath(levels int, last string) string {
	return strings.Repeat("a/", levels-1) + last
}

// TestDepthBounded: a path deeper than MaxDepth is ErrBadPath before any
// work; one at MaxDepth is written and read; a recursive listing of a
// deeper tree (a kernel can make one) stops at MaxDepth, and each entry
// it shows can be read back.
func TestDepthBounded(t *testing.T) {
	_, w := newWorkspace(t)
	for _, levels := range []int{MaxDepth + 1, 2000} {
		if _, err := w.Write(deepPath(levels, "x"), strings.NewReader("x"), 0); !errors.Is(err, ErrBadPath) {
			t.Errorf("Write at %d levels: %v", levels, err)
		}
		if _, _, err := w.Open(deepPath(levels, "x")); !errors.Is(err, ErrBadPath) {
			t.Errorf("Open at %d levels: %v", levels, err)
		}
	}
	if w.Exists("a") {
		t.Error("a refused write made folders")
	}
	if e, err := w.Write(deepPath(MaxDepth, "x"), strings.NewReader("deep"), 0); err != nil || e.Path != deepPath(MaxDepth, "x") {
		t.Fatalf("Write at MaxDepth: %+v %v", e, err)
	}
	if f, _, err := w.Open(deepPath(MaxDepth, "x")); err != nil {
		t.Fatalf("Open at MaxDepth: %v", err)
	} else {
		f.Close()
	}

	// A tree deeper than the limit, made behind the workspace's back.
	deep := filepath.Join(w.Dir(), "t", filepath.FromSlash(deepPath(MaxDepth+20, "a")))
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	list, err := w.List("t", true)
	if err != nil {
		t.Fatal(err)
	}
	most := 0
	for _, e := range list {
		n := strings.Count(e.Path, "/") + 1
		most = max(most, n)
		if _, err := w.Stat(e.Path); err != nil {
			t.Errorf("listed %d levels deep, Stat: %v", n, err)
			break
		}
	}
	if _, err := w.List("t/"+deepPath(MaxDepth-1, "a"), false); !errors.Is(err, ErrBadPath) {
		t.Errorf("listing a folder at MaxDepth: %v", err)
	}
	if _, err := w.List("t/"+deepPath(MaxDepth-2, "a"), false); err != nil {
		t.Errorf("listing a folder above MaxDepth: %v", err)
	}
	if most != MaxDepth || len(list) != MaxDepth-1 {
		t.Errorf("the listing of t went %d levels deep with %d entries, want %d and %d", most, len(list), MaxDepth, MaxDepth-1)
	}
}

// BenchmarkWriteDeep writes a file MaxDepth levels down into a fresh
// tree: the folders are made one from the other (linear in the depth).
func BenchmarkWriteDeep(b *testing.B) {
	r, err := OpenRoot(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	for i := 0; b.Loop(); i++ {
		w, err := r.Create("contexts/"+strconv.Itoa(i), nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := w.Write(deepPath(MaxDepth, "x"), strings.NewReader("x"), 0); err != nil {
			b.Fatal(err)
		}
		w.Close()
	}
}

// BenchmarkListDeep lists chains of folders 32, 64 and 128 deep: each
// folder is opened from the one above, so the time per level stays flat.
func BenchmarkListDeep(b *testing.B) {
	for _, depth := range []int{32, 64, MaxDepth} {
		b.Run(strconv.Itoa(depth), func(b *testing.B) {
			r, err := OpenRoot(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			w, err := r.Create("contexts/a", nil)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := w.Mkdir(deepPath(depth, "a")); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := w.List("", true); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(depth), "ns/level")
		})
	}
}

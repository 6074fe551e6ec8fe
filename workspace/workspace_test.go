package workspace

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
)

func newWorkspace(t *testing.T) (*Root, *Workspace) {
	t.Helper()
	r, err := OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	w, err := r.Create("contexts/a", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return r, w
}

func TestWriteReadListRemove(t *testing.T) {
	_, w := newWorkspace(t)
	e, err := w.Write("data/in/sales.csv", strings.NewReader("a,b\n1,2\n"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if e.Path != "data/in/sales.csv" || e.Name != "sales.csv" || e.Size != 8 || e.Type != "file" {
		t.Errorf("entry %+v", e)
	}
	b, err := os.ReadFile(filepath.Join(w.Dir(), "data/in/sales.csv"))
	if err != nil || string(b) != "a,b\n1,2\n" {
		t.Fatalf("on disk: %q %v", b, err)
	}
	f, _, err := w.Open("data/in/sales.csv")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(f)
	f.Close()
	if string(got) != "a,b\n1,2\n" {
		t.Errorf("read %q", got)
	}
	list, err := w.List("", true)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, e := range list {
		paths = append(paths, e.Path+":"+e.Type)
	}
	if strings.Join(paths, " ") != "data:dir data/in:dir data/in/sales.csv:file" {
		t.Errorf("recursive list %v", paths)
	}
	if list, _ := w.List("data", false); len(list) != 1 || list[0].Path != "data/in" {
		t.Errorf("list of data: %+v", list)
	}
	if _, err := w.List("data/in/sales.csv", false); !errors.Is(err, ErrNotDir) {
		t.Errorf("listing a file: %v", err)
	}
	if err := w.Remove("data", false); !errors.Is(err, ErrIsDir) {
		t.Errorf("removing a folder without recursive: %v", err)
	}
	if err := w.Remove("data", true); err != nil {
		t.Fatal(err)
	}
	if w.Exists("data") {
		t.Error("data still there")
	}
	if err := w.Remove("data", true); !errors.Is(err, ErrNotFound) {
		t.Errorf("removing twice: %v", err)
	}
	if err := w.Remove("", true); !errors.Is(err, ErrBadPath) {
		t.Errorf("removing the workspace: %v", err)
	}
}

// A write that fails half way, or passes its limit, leaves the old file
// whole and no temporary file behind.
func TestWriteAtomic(t *testing.T) {
	_, w := newWorkspace(t)
	if _, err := w.Write("f.txt", strings.NewReader("old"), 0); err != nil {
		t.Fatal(err)
	}
	broken := io.MultiReader(strings.NewReader("new new new"), iotest.ErrReader(errors.New("client went away")))
	if _, err := w.Write("f.txt", broken, 0); err == nil {
		t.Fatal("a broken body was written")
	}
	if _, err := w.Write("f.txt", strings.NewReader("0123456789"), 9); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over the limit: %v", err)
	}
	if _, err := w.Write("g.txt", strings.NewReader("0123456789"), 10); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	b, _ := os.ReadFile(filepath.Join(w.Dir(), "f.txt"))
	if string(b) != "old" {
		t.Errorf("f.txt = %q after failed writes", b)
	}
	des, _ := os.ReadDir(w.Dir())
	if len(des) != 2 {
		t.Errorf("left behind: %v", des)
	}
}

// Every way out is refused: .., absolute paths, symlinks to outside
// (absolute or relative), and a symlink is removed, not followed.
func TestEscapesRefused(t *testing.T) {
	r, w := newWorkspace(t)
	outside := filepath.Join(filepath.Dir(r.Dir()), "outside.txt")
	os.WriteFile(outside, []byte("secret"), 0o644)
	os.WriteFile(filepath.Join(r.Dir(), "contexts", "b.txt"), []byte("other"), 0o644)
	os.Symlink("/etc", filepath.Join(w.Dir(), "etc"))
	os.Symlink("../b.txt", filepath.Join(w.Dir(), "sib"))
	os.Symlink("../../../outside.txt", filepath.Join(w.Dir(), "up"))
	os.Symlink("/etc/passwd", filepath.Join(w.Dir(), "passwd"))
	os.WriteFile(filepath.Join(w.Dir(), "in.txt"), []byte("in"), 0o644)
	os.Symlink("in.txt", filepath.Join(w.Dir(), "alias"))

	for _, p := range []string{"../b.txt", "../../outside.txt", "/etc/passwd", "a/../../b.txt", "etc/passwd", "sib", "up", "passwd", "a\\..\\b", "x\x00y", "./in.txt", "a//b"} {
		if _, _, err := w.Open(p); err == nil || !(errors.Is(err, ErrBadPath) || errors.Is(err, ErrEscapes)) {
			t.Errorf("Open(%q): %v", p, err)
		}
		if _, err := w.List(p, false); err == nil {
			t.Errorf("List(%q) succeeded", p)
		}
	}
	for _, p := range []string{"../b.txt", "/etc/x", "a/../../b.txt", "a\\b", "x\x00y", "./in.txt", "a//b", ""} {
		if _, err := w.Write(p, strings.NewReader("x"), 0); !errors.Is(err, ErrBadPath) {
			t.Errorf("Write(%q): %v", p, err)
		}
	}
	if _, err := w.Write("etc/evil", strings.NewReader("x"), 0); !errors.Is(err, ErrEscapes) && !errors.Is(err, ErrNotDir) {
		t.Errorf("write through a symlinked folder: %v", err)
	}
	if _, err := os.Stat("/etc/evil"); err == nil {
		t.Fatal("wrote into /etc")
	}
	// A symlink that stays inside is followed.
	f, e, err := w.Open("alias")
	if err != nil {
		t.Fatalf("inside symlink: %v", err)
	}
	f.Close()
	if e.Size != 2 {
		t.Errorf("alias entry %+v", e)
	}
	// Removing a symlink removes the link only.
	if err := w.Remove("etc", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatal("removing the symlink touched /etc")
	}
	// Writing over a symlink replaces the link, not its target.
	if _, err := w.Write("passwd", strings.NewReader("mine"), 0); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile("/etc/passwd"); string(b) == "mine" {
		t.Fatal("wrote through a symlink")
	}
	list, _ := w.List("", false)
	for _, e := range list {
		if e.Name == "sib" && e.Type != "symlink" {
			t.Errorf("sib listed as %s", e.Type)
		}
	}
}

func TestRootCreateReuseDelete(t *testing.T) {
	r, w := newWorkspace(t)
	w.Write("keep.txt", strings.NewReader("k"), 0)
	w2, err := r.Create("contexts/a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !w2.Exists("keep.txt") {
		t.Error("a workspace made again lost its files")
	}
	for _, bad := range []string{"", ".", "..", "../x", "/abs", "contexts/../../x"} {
		if _, err := r.Create(bad, nil); !errors.Is(err, ErrBadPath) {
			t.Errorf("Create(%q): %v", bad, err)
		}
	}
	if err := w2.Delete(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(w.Dir()); !os.IsNotExist(err) {
		t.Errorf("deleted workspace still on disk: %v", err)
	}
	if _, err := w2.Write("x", strings.NewReader("x"), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("write after delete: %v", err)
	}
}

func TestTempRootRemovedOnClose(t *testing.T) {
	r, err := TempRoot()
	if err != nil {
		t.Fatal(err)
	}
	w, err := r.Create("runs/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	w.Write("f", strings.NewReader("x"), 0)
	w.Close()
	r.Close()
	if _, err := os.Stat(r.Dir()); !os.IsNotExist(err) {
		t.Errorf("temporary root left: %v", err)
	}
}

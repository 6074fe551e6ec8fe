package workspace

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestLockRoot: a root is held by one owner at a time; the second is
// told who holds it; closing the lock frees the root.
func TestLockRoot(t *testing.T) {
	dir := t.TempDir()
	first, err := LockRoot(dir, "state dir /a")
	if err != nil {
		t.Fatal(err)
	}
	_, err = LockRoot(dir, "state dir /b")
	if !errors.Is(err, ErrRootInUse) {
		t.Fatalf("second lock: %v, want ErrRootInUse", err)
	}
	if want := fmt.Sprintf("pid %d (state dir /a)", os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Errorf("message %q does not name the holder (%s)", err, want)
	}
	first.Close()
	again, err := LockRoot(dir, "state dir /b")
	if err != nil {
		t.Fatalf("after Close: %v", err)
	}
	again.Close()
}

// TestShareRoot: replicas share a root, any number at once; a gateway of
// its own is refused beside them, and they beside it.
func TestShareRoot(t *testing.T) {
	dir := t.TempDir()
	a, err := ShareRoot(dir, "replica a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := ShareRoot(dir, "replica b")
	if err != nil {
		t.Fatalf("a second replica on the root: %v", err)
	}
	if _, err := LockRoot(dir, "state dir /c"); !errors.Is(err, ErrRootInUse) || !strings.Contains(err.Error(), "replicas") {
		t.Fatalf("a gateway of its own beside replicas: %v, want ErrRootInUse naming the replicas", err)
	}
	a.Close()
	b.Close()
	one, err := LockRoot(dir, "state dir /c")
	if err != nil {
		t.Fatalf("the root once the replicas left: %v", err)
	}
	defer one.Close()
	if _, err := ShareRoot(dir, "replica d"); !errors.Is(err, ErrRootInUse) {
		t.Fatalf("a replica beside a gateway of its own: %v, want ErrRootInUse", err)
	}
}

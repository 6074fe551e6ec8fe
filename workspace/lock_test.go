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

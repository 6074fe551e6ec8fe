//go:build linux

package workspace

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kernelgate/internal/needs"
)

// answers runs f and fails the test if it has not returned within d: an
// open that waits for a FIFO's writer never returns on its own.
func answers(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s: no answer within %v", what, d)
	}
}

// releaseFIFO opens the FIFO at p for reading and writing when the test
// ends, which lets an open that waits on it go on (on the old code).
func releaseFIFO(t *testing.T, p string) {
	t.Cleanup(func() {
		if f, err := os.OpenFile(p, os.O_RDWR|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
}

// TestSpecialFilesRefusedAtOnce: a FIFO, a socket and a device are
// refused at once, by name or through a symlink, and listed with their
// type; a FIFO is never waited on.
func TestSpecialFilesRefusedAtOnce(t *testing.T) {
	_, w := newWorkspace(t)
	pipe := filepath.Join(w.Dir(), "pipe")
	if err := syscall.Mkfifo(pipe, 0o644); err != nil {
		t.Fatal(err)
	}
	releaseFIFO(t, pipe)
	os.Symlink("pipe", filepath.Join(w.Dir(), "alias"))
	l, err := net.Listen("unix", filepath.Join(w.Dir(), "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	names := []string{"pipe", "alias", "sock"}
	if err := syscall.Mknod(filepath.Join(w.Dir(), "null"), syscall.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		needs.Skip(t, "mknod of a character device: %v (needs root)", err)
	}
	names = append(names, "null")
	for _, p := range names {
		var err error
		answers(t, 10*time.Second, "Open("+p+")", func() {
			var f *os.File
			if f, _, err = w.Open(p); err == nil {
				f.Close()
			}
		})
		if !errors.Is(err, ErrBadPath) || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("Open(%s): %v", p, err)
		}
	}
	list, err := w.List("", false)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range list {
		got = append(got, e.Path+":"+e.Type)
	}
	if want := "alias:symlink null:device pipe:fifo sock:socket"; strings.Join(got, " ") != want {
		t.Errorf("listing %v, want %s", got, want)
	}
	if e, err := w.Stat("alias"); err != nil || e.Type != "fifo" || e.Size != 0 {
		t.Errorf("Stat(alias) = %+v %v", e, err)
	}
}

// TestOpenNeverWaitsOnASwappedFIFO: while the name is swapped between a
// regular file and a FIFO as fast as the machine goes (what a kernel can
// do between the check of a path and its open), every Open answers: the
// file, or a refusal.
func TestOpenNeverWaitsOnASwappedFIFO(t *testing.T) {
	_, w := newWorkspace(t)
	if err := os.WriteFile(filepath.Join(w.Dir(), "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	pipe := filepath.Join(w.Dir(), "g")
	if err := syscall.Mkfifo(pipe, 0o644); err != nil {
		t.Fatal(err)
	}
	releaseFIFO(t, filepath.Join(w.Dir(), "f"))
	releaseFIFO(t, pipe)
	dir, err := os.Open(w.Dir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	fd := int(dir.Fd())
	stop := make(chan struct{})
	swapped := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				swapped <- nil
				return
			default:
			}
			if err := unix.Renameat2(fd, "f", fd, "g", unix.RENAME_EXCHANGE); err != nil {
				swapped <- err
				return
			}
		}
	}()
	files, refused := 0, 0
	var odd error
	answers(t, 30*time.Second, "10000 opens of a name swapped with a FIFO", func() {
		for range 10000 {
			f, _, err := w.Open("f")
			switch {
			case err == nil:
				files++
				f.Close()
			case errors.Is(err, ErrBadPath):
				refused++
			default:
				odd = err
				return
			}
		}
	})
	if odd != nil {
		t.Errorf("Open: %v", odd)
	}
	close(stop)
	if err := <-swapped; err != nil {
		needs.Skip(t, "renameat2(RENAME_EXCHANGE): %v", err)
	}
	t.Logf("%d opens found the file, %d the FIFO", files, refused)
}

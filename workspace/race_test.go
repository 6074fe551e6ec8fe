//go:build linux

package workspace

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"kernelgate/internal/needs"
)

// swapReader calls swap on its first read, then yields its data: the
// folder of an upload changes while the upload is under way (its
// temporary file made).
type swapReader struct {
	data    string
	swap    func() error
	swapped bool
	err     error
}

func (s *swapReader) Read(p []byte) (int, error) {
	if !s.swapped {
		s.swapped = true
		s.err = s.swap()
	}
	if s.data == "" {
		return 0, io.EOF
	}
	n := copy(p, s.data)
	s.data = s.data[n:]
	return n, nil
}

// leftovers lists the temporary upload files under dirs.
func leftovers(dirs ...string) []string {
	var out []string
	for _, d := range dirs {
		filepath.WalkDir(d, func(p string, de fs.DirEntry, err error) error {
			if err == nil && strings.HasPrefix(de.Name(), ".kgupload-") {
				out = append(out, p)
			}
			return nil
		})
	}
	return out
}

// TestWriteFolderSwappedMidUpload: the folder of an upload is exchanged
// with a symlink leading out of the workspace (renameat2 RENAME_EXCHANGE)
// while the body is read. The write ends in the folder it began in,
// nothing reaches the symlink's target, and no temporary file is left.
func TestWriteFolderSwappedMidUpload(t *testing.T) {
	r, w := newWorkspace(t)
	outside := filepath.Join(filepath.Dir(r.Dir()), "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(w.Dir(), "race"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(w.Dir(), "link")); err != nil {
		t.Fatal(err)
	}
	body := &swapReader{data: "uploaded", swap: func() error {
		return unix.Renameat2(unix.AT_FDCWD, filepath.Join(w.Dir(), "race"), unix.AT_FDCWD, filepath.Join(w.Dir(), "link"), unix.RENAME_EXCHANGE)
	}}
	e, err := w.Write("race/q", body, 0)
	if body.err != nil {
		needs.Skip(t, "renameat2(RENAME_EXCHANGE): %v", body.err)
	}
	if err != nil {
		t.Errorf("Write: %v (a folder swapped during an upload is not an error of the caller's)", err)
	} else if e.Path != "race/q" || e.Size != int64(len("uploaded")) {
		t.Errorf("entry %+v", e)
	}
	// The folder the upload began in is now called link.
	if b, err := os.ReadFile(filepath.Join(w.Dir(), "link", "q")); err != nil || string(b) != "uploaded" {
		t.Errorf("the file in the folder it was written to: %q %v", b, err)
	}
	if des, _ := os.ReadDir(outside); len(des) != 0 {
		t.Errorf("written outside the workspace: %v", des)
	}
	if left := leftovers(r.Dir(), outside); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestWriteFailureLeavesNothingAfterSwap: an upload that fails after its
// folder was swapped for a symlink leading out still removes its
// temporary file, and says what failed.
func TestWriteFailureLeavesNothingAfterSwap(t *testing.T) {
	r, w := newWorkspace(t)
	outside := filepath.Join(filepath.Dir(r.Dir()), "outside")
	os.Mkdir(outside, 0o755)
	os.Mkdir(filepath.Join(w.Dir(), "race"), 0o755)
	os.Symlink(outside, filepath.Join(w.Dir(), "link"))
	body := &swapReader{data: "0123456789", swap: func() error {
		return unix.Renameat2(unix.AT_FDCWD, filepath.Join(w.Dir(), "race"), unix.AT_FDCWD, filepath.Join(w.Dir(), "link"), unix.RENAME_EXCHANGE)
	}}
	_, err := w.Write("race/q", body, 5)
	if body.err != nil {
		needs.Skip(t, "renameat2(RENAME_EXCHANGE): %v", body.err)
	}
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("Write over the limit: %v", err)
	}
	if left := leftovers(r.Dir(), outside); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	// A new upload through the swapped name is refused as an escape (400),
	// not an unknown error.
	if _, err := w.Write("race/q", strings.NewReader("x"), 0); !errors.Is(err, ErrEscapes) {
		t.Errorf("Write through a symlink leading out: %v", err)
	}
	if des, _ := os.ReadDir(outside); len(des) != 0 {
		t.Errorf("written outside the workspace: %v", des)
	}
}

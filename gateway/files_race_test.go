package gateway

import (
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"kernelgate/internal/needs"
)

// uploadLeftovers lists the temporary upload files under dirs.
func uploadLeftovers(dirs ...string) []string {
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

// exchangeCode is Python that swaps two names of the kernel's cwd with
// renameat2(RENAME_EXCHANGE), printing "ok" or the error.
func exchangeCode(a, b string) string {
	return fmt.Sprintf(`
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print("ok" if libc.renameat2(-100, b%q, -100, b%q, 2) == 0 else os.strerror(ctypes.get_errno()))
`, a, b)
}

// TestFilesUploadFolderSwapped: while an upload's body is on its way,
// the kernel exchanges the upload's folder with a symlink leading out of
// the workspace. The upload lands in the folder it began in (201), never
// behind the symlink; no temporary file is left; and uploads racing a
// kernel that swaps the two without end answer 201 or 400, never 500,
// and leave nothing behind either.
func TestFilesUploadFolderSwapped(t *testing.T) {
	g := newGateway(t)
	b4Context(t, g, map[string]any{"id": "race"})
	outside := t.TempDir()
	mustRun(t, g, map[string]any{"context": "race", "code": fmt.Sprintf("import os; os.mkdir('race'); os.symlink(%q, 'link')", outside)})
	c, err := g.mgr.Context("race")
	if err != nil {
		t.Fatal(err)
	}
	dir := c.Workspace().Dir()

	// One upload, swapped half way.
	pr, pw := io.Pipe()
	type answer struct {
		status int
		body   string
		err    error
	}
	answered := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest("PUT", g.url+"/api/contexts/race/files/race/q", pr)
		req.Header.Set("Authorization", "Bearer "+g.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answered <- answer{status: resp.StatusCode, body: string(b)}
	}()
	if _, err := pw.Write([]byte("first half, ")); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 30*time.Second, "the upload's temporary file", func() bool {
		return len(uploadLeftovers(filepath.Join(dir, "race"))) == 1
	})
	if got := strings.TrimSpace(stdoutOf(mustRun(t, g, map[string]any{"context": "race", "code": exchangeCode("race", "link")}))); got != "ok" {
		needs.Skip(t, "renameat2 in the kernel: %s", got)
	}
	pw.Write([]byte("second half"))
	pw.Close()
	a := <-answered
	if a.err != nil || a.status != http.StatusCreated {
		t.Errorf("PUT with its folder swapped: %d %s %v, want 201", a.status, a.body, a.err)
	}
	// The folder the upload began in is now called link.
	if b, err := os.ReadFile(filepath.Join(dir, "link", "q")); err != nil || string(b) != "first half, second half" {
		t.Errorf("the upload in its folder: %q %v", b, err)
	}
	if des, _ := os.ReadDir(outside); len(des) != 0 {
		t.Errorf("written outside the workspace: %v", des)
	}
	if left := uploadLeftovers(dir, outside); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}

	// Many uploads while the kernel swaps without end.
	mustRun(t, g, map[string]any{"context": "race", "code": `
import ctypes, os, threading
libc = ctypes.CDLL(None, use_errno=True)
def swap():
    while not os.path.exists('stop'):
        libc.renameat2(-100, b'race', -100, b'link', 2)
threading.Thread(target=swap, daemon=True).start()
`})
	var created, refused atomic.Int64
	err = flood(200, 8, func(i int) error {
		status, body, err := g.send("PUT", fmt.Sprintf("/api/contexts/race/files/race/q%d", i), strings.Repeat("x", 64<<10), g.auth())
		switch {
		case err != nil:
			return err
		case status == http.StatusCreated:
			created.Add(1)
		case status == http.StatusBadRequest || status == http.StatusNotFound:
			refused.Add(1)
		default:
			return fmt.Errorf("PUT race/q%d: %d %s", i, status, body)
		}
		return nil
	})
	os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644)
	if err != nil {
		t.Error(err)
	}
	t.Logf("racing uploads: %d created, %d refused", created.Load(), refused.Load())
	if des, _ := os.ReadDir(outside); len(des) != 0 {
		t.Errorf("written outside the workspace: %d entries", len(des))
	}
	if left := uploadLeftovers(dir, outside); len(left) != 0 {
		t.Errorf("%d temporary files left, such as %s", len(left), left[0])
	}
}

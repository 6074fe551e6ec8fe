//go:build linux

package local

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kernelgate/internal/testkernels"

	"kernelgate/jupyter"
)

func TestHomeSeedSavesTheFontCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	seed := filepath.Join(t.TempDir(), "seed")
	if err := PrepareHomeSeed(ctx, seed, "/usr/bin/python3"); err != nil {
		t.Fatal(err)
	}
	fonts, _ := filepath.Glob(filepath.Join(seed, ".config", "matplotlib", "fontlist-*.json"))
	if len(fonts) != 1 {
		t.Fatalf("seed holds %v, want one font list", fonts)
	}
	// matplotlib rebuilds its font list in a fresh HOME, not in a seeded one.
	const probe = "import io, logging\nbuf = io.StringIO()\nlg = logging.getLogger('matplotlib.font_manager')\n" +
		"lg.addHandler(logging.StreamHandler(buf)); lg.setLevel(logging.INFO)\n" +
		"from matplotlib import font_manager\n'rebuilt' if 'generated new fontManager' in buf.getvalue() else 'cached'"
	// A sandboxed kernel reads (and may update) the copy of the seed, which
	// belongs to its sandbox user.
	for _, c := range []struct {
		name, seed, want string
		sandbox          *SandboxConfig
	}{
		{"seeded", seed, "'cached'", nil},
		{"fresh", "", "'rebuilt'", nil},
		{"seeded, sandboxed", seed, "'cached'", &SandboxConfig{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var runtime string
			if c.sandbox != nil {
				needSandbox(t)
				runtime = sandboxRuntime(t)
			} else {
				runtime = t.TempDir()
			}
			prov := &Provisioner{RuntimeDir: runtime, HomeSeed: c.seed, Sandbox: c.sandbox}
			k, err := jupyter.Start(ctx, prov, jupyter.Config{Spec: testkernels.Spec(t, "python3")})
			if err != nil {
				t.Fatal(err)
			}
			defer k.Shutdown(context.Background())
			_, col := execute(t, k, probe)
			if got := plainText(t, contentOf(t, col.await(t, jupyter.ExecuteResult, 30*time.Second))); got != c.want {
				t.Errorf("seed %q: font list %s, want %s", c.seed, got, c.want)
			}
		})
	}
	// A missing seed is no error: kernels start without it.
	if err := copySeed(filepath.Join(t.TempDir(), "none"), t.TempDir()); err != nil {
		t.Error(err)
	}
	os.RemoveAll(seed)
}

// historyOf asks k for its last n inputs (history_request, tail).
func historyOf(t *testing.T, k *jupyter.Kernel, n int) [][3]any {
	t.Helper()
	m, err := k.NewMessage("history_request", map[string]any{"output": false, "raw": true, "hist_access_type": "tail", "n": n}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := k.Request(jupyter.Shell, m, nil, jupyter.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reply, err := c.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Status  string   `json:"status"`
		History [][3]any `json:"history"`
	}
	if err := reply.DecodeContent(&r); err != nil || r.Status != "ok" {
		t.Fatalf("history_reply %+v: %v", r, err)
	}
	return r.History
}

// ipythonTree lists the kernel's IPYTHONDIR: path, type and mode of each
// entry, with its history database's tables.
const ipythonTree = `
import os, sqlite3
root = os.environ['IPYTHONDIR']
for d, dirs, files in sorted(os.walk(root)):
    for n in sorted(dirs + files):
        if n.endswith('-journal'):  # while the history is being saved
            continue
        p = os.path.join(d, n)
        print(os.path.relpath(p, root), oct(os.stat(p).st_mode))
db = sqlite3.connect(os.path.join(root, 'profile_default', 'history.sqlite'))
print(sorted(r[0] for r in db.execute("select name from sqlite_master where type = 'table'")))
`

// TestHomeSeedHoldsTheHistoryDatabase: the seed carries IPython's empty
// history database, so a kernel does not create its tables; a seeded
// kernel's IPython directory and history read as a fresh kernel's, and
// each kernel keeps a history of its own.
func TestHomeSeedHoldsTheHistoryDatabase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	seed := filepath.Join(t.TempDir(), "seed")
	if err := PrepareHomeSeed(ctx, seed, "/usr/bin/python3"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(seed, ".ipython", "profile_default", "history.sqlite")); err != nil {
		t.Fatalf("seed: %v", err)
	}
	spec := testkernels.Spec(t, "python3")
	seeded := &Provisioner{RuntimeDir: t.TempDir(), HomeSeed: seed}
	a := startWith(t, seeded, jupyter.Config{Spec: spec})
	b := startWith(t, seeded, jupyter.Config{Spec: spec})
	fresh := startWith(t, &Provisioner{RuntimeDir: t.TempDir()}, jupyter.Config{Spec: spec})

	stdout(t, a, "x = 1")
	stdout(t, a, "y = 2")
	stdout(t, b, "z = 3")
	stdout(t, fresh, "x = 1")
	stdout(t, fresh, "y = 2")
	if got, want := historyOf(t, a, 10), historyOf(t, fresh, 10); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("history of a seeded kernel %v, of a fresh one %v", got, want)
	}
	if got := fmt.Sprint(historyOf(t, b, 10)); got != "[[1 1 z = 3]]" {
		t.Errorf("history of the other seeded kernel: %s", got)
	}
	if got, want := stdout(t, a, "%history -n"), stdout(t, fresh, "%history -n"); got != want || !strings.Contains(got, "2: y = 2") {
		t.Errorf("%%history of a seeded kernel %q, of a fresh one %q", got, want)
	}
	if got, want := stdout(t, a, ipythonTree), stdout(t, fresh, ipythonTree); got != want {
		t.Errorf("IPython directory of a seeded kernel:\n%s\nof a fresh one:\n%s", got, want)
	}
}

// TestHalfBuiltSeedsOfGoneGatewaysAreRemoved: a gateway killed while it
// built the seed leaves its half-built directory; the next one to build a
// seed there removes it, and leaves alone one whose gateway still runs.
func TestHalfBuiltSeedsOfGoneGatewaysAreRemoved(t *testing.T) {
	self, ok := thisGateway()
	if !ok {
		t.Fatal("no /proc: this gateway cannot name itself")
	}
	gone := exec.Command("/bin/true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	start, _ := processStart(os.Getpid())
	dead := gatewayID{PID: gone.Process.Pid, Start: start, PidNS: self.PidNS}
	root := t.TempDir()
	left := filepath.Join(root, ".seed-1."+dead.tag())
	running := filepath.Join(root, ".seed-2."+self.tag())
	for _, d := range []string{left, running} {
		if err := os.MkdirAll(filepath.Join(d, ".config", "matplotlib"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := PrepareHomeSeed(ctx, filepath.Join(root, "seed"), "/usr/bin/python3"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("the half-built seed of a gone gateway is still there: %v", err)
	}
	if _, err := os.Stat(running); err != nil {
		t.Fatalf("the half-built seed of a running gateway was removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "seed", ".ipython")); err != nil {
		t.Fatalf("no seed was built: %v", err)
	}
}

//go:build linux

package jupyter

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"kernelgate/internal/testkernels"
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
			prov := &LocalProvisioner{RuntimeDir: runtime, HomeSeed: c.seed, Sandbox: c.sandbox}
			k, err := Start(ctx, prov, Config{Spec: testkernels.Spec(t, "python3")})
			if err != nil {
				t.Fatal(err)
			}
			defer k.Shutdown(context.Background())
			_, col := execute(t, k, probe)
			if got := plainText(t, contentOf(t, col.await(t, ExecuteResult, 30*time.Second))); got != c.want {
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

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
	for _, c := range []struct{ seed, want string }{{seed, "'cached'"}, {"", "'rebuilt'"}} {
		k, err := Start(ctx, &LocalProvisioner{RuntimeDir: t.TempDir(), HomeSeed: c.seed}, Config{Spec: testkernels.Spec(t, "python3")})
		if err != nil {
			t.Fatal(err)
		}
		_, col := execute(t, k, probe)
		got := plainText(t, contentOf(t, col.await(t, ExecuteResult, 30*time.Second)))
		k.Shutdown(context.Background())
		if got != c.want {
			t.Errorf("seed %q: font list %s, want %s", c.seed, got, c.want)
		}
	}
	// A missing seed is no error: kernels start without it.
	if err := copySeed(filepath.Join(t.TempDir(), "none"), t.TempDir()); err != nil {
		t.Error(err)
	}
	os.RemoveAll(seed)
}

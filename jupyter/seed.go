package jupyter

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// A home seed is a directory the gateway itself prepares and copies into
// every new kernel's fresh HOME. It holds caches that are costly to build
// and safe to share because no kernel wrote them: today matplotlib's font
// list, which a fresh MPLCONFIGDIR would otherwise rebuild (about a
// second) on each kernel's first plot.

// PrepareHomeSeed builds the seed in dir with python (a Python that has
// matplotlib; nothing is built without it), then publishes it at once by
// a rename, so a launch copies a whole seed or none.
func PrepareHomeSeed(ctx context.Context, dir, python string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, ".seed-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	kd := KernelDirs{Root: tmp, Home: tmp, Work: tmp, Tmp: tmp}
	env := CleanEnv(kd)
	cmd := exec.CommandContext(ctx, python, "-c", "import matplotlib.font_manager")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the font cache with %s: %v: %s", python, err, strings.TrimSpace(string(out)))
	}
	// Keep only the caches: nothing that reads as configuration.
	keep := filepath.Join(tmp, ".config", "matplotlib")
	entries, _ := os.ReadDir(keep)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "fontlist-") {
			os.RemoveAll(filepath.Join(keep, e.Name()))
		}
	}
	return os.Rename(tmp, dir)
}

// copySeed copies the regular files and directories of seed into home.
func copySeed(seed, home string) error {
	if seed == "" {
		return nil
	}
	if _, err := os.Stat(seed); err != nil {
		return nil // not built (yet): kernels start without it
	}
	return filepath.WalkDir(seed, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(seed, path)
		if err != nil || rel == "." {
			return err
		}
		dst := filepath.Join(home, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, 0o700)
		case d.Type().IsRegular():
			return copyFile(path, dst)
		}
		return nil // links and others are not copied
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

package local

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"kernelgate/internal/sysproc"
	"kernelgate/internal/tailbuf"
)

// A home seed is a directory the gateway itself prepares and copies into
// every new kernel's fresh HOME. It holds files that are costly to build
// and safe to copy because no kernel wrote them:
//
//   - matplotlib's font list, which a fresh MPLCONFIGDIR would otherwise
//     rebuild (about a second) on each kernel's first plot;
//   - IPython's empty history database (.ipython/profile_default/
//     history.sqlite, its tables made by IPython's own code), which a
//     fresh IPYTHONDIR would otherwise create at each kernel's start: three
//     CREATE TABLE statements, each a transaction of its own with its
//     fsyncs. With the copy they find their tables and write nothing; each
//     kernel still has its own database, and its first session is number 1
//     as in a fresh one.
//
// Files and directories keep the modes they were made with, as IPython and
// matplotlib make them in a fresh HOME.

// seedScript builds the seed's files in the HOME of its environment.
const seedScript = `
import os
from IPython.core.history import HistoryAccessor
profile = os.path.join(os.environ["IPYTHONDIR"], "profile_default")
os.makedirs(profile, mode=0o755)  # as IPython makes them
HistoryAccessor(hist_file=os.path.join(profile, "history.sqlite")).db.close()
try:
    import matplotlib.font_manager
except ImportError:
    pass
`

// PrepareHomeSeed builds the seed in dir with python (a Python that has
// IPython; matplotlib's font list is left out without matplotlib), then
// publishes it at once by a rename, so a launch copies a whole seed or
// none.
//
// The builder dies with the gateway (the parent-death signal), and the
// half-built seeds of gateways that are gone (their directories name
// their builder, as a kernel cgroup names its gateway) are removed first.
func PrepareHomeSeed(ctx context.Context, dir, python string) error {
	parent := filepath.Dir(dir)
	removeStaleSeeds(parent)
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return err
	}
	pattern := ".seed-*"
	if g, ok := thisGateway(); ok {
		pattern += "." + g.tag()
	}
	tmp, err := os.MkdirTemp(parent, pattern)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	kd := KernelDirs{Root: tmp, Home: tmp, Work: tmp, Tmp: tmp}
	env := CleanEnv(kd)
	cmd := exec.CommandContext(ctx, python, "-c", seedScript)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Dir = tmp
	cmd.SysProcAttr = sysproc.GroupAttr()
	out := tailbuf.New(4096)
	cmd.Stdout, cmd.Stderr = out, out
	err = startOnParentThread(cmd) // its Pdeathsig follows that thread (zygote.go)
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		return fmt.Errorf("building the home seed with %s: %v: %s", python, err, strings.TrimSpace(out.String()))
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

// removeStaleSeeds removes the half-built seeds in dir whose builder's
// gateway is gone.
func removeStaleSeeds(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), ".seed-") {
			continue
		}
		if g, ok := cgroupOwner(e.Name()); ok && !g.mayRun() {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

// copySeed copies the regular files and directories of seed into home,
// with their permission bits (less the umask).
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
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, info.Mode().Perm())
		case d.Type().IsRegular():
			return copyFile(path, dst, info.Mode().Perm())
		}
		return nil // links and others are not copied
	})
}

func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

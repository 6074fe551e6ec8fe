package state

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
)

// FileName is the store's file in the state directory.
const FileName = "kernelgate.db"

// DefaultDir is where state is kept when --state-dir is not given:
// $XDG_STATE_HOME/kernelgate, else ~/.local/state/kernelgate (the XDG Base
// Directory rule: a relative XDG_STATE_HOME is ignored).
func DefaultDir(getenv func(string) string) (string, error) {
	if x := getenv("XDG_STATE_HOME"); x != "" && filepath.IsAbs(x) {
		return filepath.Join(x, "kernelgate"), nil
	}
	home := getenv("HOME")
	if home == "" {
		var err error
		if home, err = os.UserHomeDir(); err != nil {
			return "", fmt.Errorf("state: no state directory: set --state-dir, XDG_STATE_HOME or HOME: %w", err)
		}
	}
	return filepath.Join(home, ".local", "state", "kernelgate"), nil
}

// ResolveDir returns the state directory of kernelgate: dir when it was
// set (by --state-dir or KERNELGATE_STATE_DIR; "" then means memory
// only), DefaultDir otherwise. A relative dir is made absolute, so that
// a later change of working directory does not move it.
func ResolveDir(dir string, set bool, getenv func(string) string) (string, error) {
	if !set {
		return DefaultDir(getenv)
	}
	if dir == "" {
		return "", nil
	}
	return filepath.Abs(dir)
}

// private makes path (a directory when dir, else a regular file) mode
// perm: it fixes a wider mode of what this user owns, and refuses what
// another user owns, a symbolic link, or a sticky shared directory such
// as /tmp.
func private(log *slog.Logger, path string, dir bool, perm os.FileMode) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("%w: %s is a symbolic link", ErrUnsafe, path)
	case dir && !fi.IsDir():
		return fmt.Errorf("%w: %s is not a directory", ErrUnsafe, path)
	case !dir && !fi.Mode().IsRegular():
		return fmt.Errorf("%w: %s is not a regular file", ErrUnsafe, path)
	case fi.Mode()&os.ModeSticky != 0:
		return fmt.Errorf("%w: %s is a shared directory (sticky bit): choose a directory of kernelgate's own", ErrUnsafe, path)
	}
	if uid, ok := ownerUID(fi); ok && uid != os.Geteuid() {
		return fmt.Errorf("%w: %s belongs to uid %d, not to this user (uid %d)", ErrUnsafe, path, uid, os.Geteuid())
	}
	if fi.Mode().Perm() == perm {
		return nil
	}
	if err := os.Chmod(path, perm); err != nil {
		return fmt.Errorf("%w: %s has mode %v and cannot be made %v: %v", ErrUnsafe, path, fi.Mode().Perm(), perm, err)
	}
	log.Warn("state: made private", "path", path, "was", fi.Mode().Perm().String(), "now", perm.String())
	return nil
}

// prepare makes the state directory (0700) and, when it exists, checks
// the store file (0600).
func prepare(log *slog.Logger, path string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	if err := private(log, dir, true, 0o700); err != nil {
		return err
	}
	if err := private(log, path, false, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

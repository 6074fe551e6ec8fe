package kernelspecs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ResourcePath returns the absolute path of file inside s.Dir. file is
// slash-separated and relative, like the tail of a URL path; it must name a
// regular file in or below s.Dir, after resolving symlinks. Every error
// wraps fs.ErrNotExist, whether the file is missing, is not a regular file,
// has a rejected name ("..", absolute, backslash, NUL, empty, unclean) or
// resolves outside s.Dir.
func (s *Spec) ResourcePath(file string) (string, error) {
	if !validResourceName(file) {
		return "", resourceError(file, errors.New("invalid name"))
	}
	if s.Dir == "" || !filepath.IsAbs(s.Dir) {
		return "", resourceError(file, errors.New("spec has no absolute resource dir"))
	}
	full := filepath.Join(s.Dir, filepath.FromSlash(file))
	root, err := filepath.EvalSymlinks(s.Dir)
	if err != nil {
		return "", resourceError(file, err)
	}
	resolved, err := filepath.EvalSymlinks(full)
	if err != nil {
		return "", resourceError(file, err)
	}
	if !inside(root, resolved) {
		return "", resourceError(file, errors.New("outside the resource dir"))
	}
	fi, err := os.Stat(resolved)
	if err != nil {
		return "", resourceError(file, err)
	}
	if !fi.Mode().IsRegular() {
		return "", resourceError(file, errors.New("not a regular file"))
	}
	return full, nil
}

func resourceError(file string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("kernelspecs: resource %q: %w", file, err)
	}
	return fmt.Errorf("kernelspecs: resource %q: %w: %w", file, fs.ErrNotExist, err)
}

// validResourceName reports whether file is a clean, relative,
// slash-separated path with no "." or ".." elements, backslashes or NULs.
func validResourceName(file string) bool {
	return file != "." &&
		fs.ValidPath(file) &&
		!strings.ContainsAny(file, "\\\x00") &&
		filepath.IsLocal(filepath.FromSlash(file))
}

// inside reports whether path is strictly below root; both must be clean.
func inside(root, path string) bool {
	prefix := root
	if !strings.HasSuffix(prefix, string(filepath.Separator)) {
		prefix += string(filepath.Separator)
	}
	return len(path) > len(prefix) && strings.HasPrefix(path, prefix)
}

// listResources returns the resources directly in s.Dir that Jupyter
// serves: kernel.js, kernel.css and logo-* images (.png, .svg), the logos
// keyed by file name without extension. When two logos share a key the
// first in name order wins. Only names ResourcePath accepts are listed; an
// unreadable Dir gives no resources.
func listResources(s *Spec) map[string]string {
	res := make(map[string]string)
	entries, _ := os.ReadDir(s.Dir)
	for _, e := range entries {
		name := e.Name()
		key, ok := resourceKey(name)
		if !ok {
			continue
		}
		if _, dup := res[key]; dup {
			continue
		}
		if _, err := s.ResourcePath(name); err != nil {
			continue
		}
		res[key] = name
	}
	return res
}

func resourceKey(name string) (string, bool) {
	switch name {
	case "kernel.js", "kernel.css":
		return name, true
	}
	if !strings.HasPrefix(name, "logo-") {
		return "", false
	}
	ext := filepath.Ext(name)
	switch strings.ToLower(ext) {
	case ".png", ".svg":
		return strings.TrimSuffix(name, ext), true
	}
	return "", false
}

package kernelspecs

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// SearchPath returns the kernelspec directories to search, highest
// priority first: extra as given, <entry>/kernels for each entry of
// $JUPYTER_PATH, the user data dir's kernels ($JUPYTER_DATA_DIR, else
// $XDG_DATA_HOME/jupyter, else $HOME/.local/share/jupyter), then
// /usr/local/share/jupyter/kernels and /usr/share/jupyter/kernels.
// Paths are cleaned, empty ones dropped and duplicates removed, keeping the
// first. getenv reads the environment; nil means os.Getenv.
func SearchPath(extra []string, getenv func(string) string) []string {
	if getenv == nil {
		getenv = os.Getenv
	}
	var dirs []string
	seen := make(map[string]bool)
	add := func(dir string) {
		if dir == "" {
			return
		}
		dir = filepath.Clean(dir)
		if !seen[dir] {
			seen[dir] = true
			dirs = append(dirs, dir)
		}
	}
	for _, d := range extra {
		add(d)
	}
	for _, p := range filepath.SplitList(getenv("JUPYTER_PATH")) {
		if p != "" {
			add(filepath.Join(p, "kernels"))
		}
	}
	if d := userDataDir(getenv); d != "" {
		add(filepath.Join(d, "kernels"))
	}
	add("/usr/local/share/jupyter/kernels")
	add("/usr/share/jupyter/kernels")
	return dirs
}

// userDataDir returns Jupyter's per-user data directory, or "" if the
// environment names none.
func userDataDir(getenv func(string) string) string {
	if d := getenv("JUPYTER_DATA_DIR"); d != "" {
		return d
	}
	if d := getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "jupyter")
	}
	if d := getenv("HOME"); d != "" {
		return filepath.Join(d, ".local", "share", "jupyter")
	}
	return ""
}

// Problem is a kernel.json that was found but skipped, or a directory or
// directory entry that could not be read.
type Problem struct {
	Path string
	Err  error
}

// Catalog is the set of kernelspecs found, first match per name wins.
// It does not change after Load and is safe for concurrent use.
type Catalog struct {
	dirs     []string
	specs    map[string]*Spec
	names    []string // sorted keys of specs
	problems []Problem
}

// Load reads every <dir>/<name>/kernel.json in dirs, earlier dirs first.
// Missing dirs, plain files and subdirectories without kernel.json are
// skipped silently. A kernel.json that fails to parse, or an entry that
// cannot be read, is recorded as a Problem. The first kernel.json found
// for a name claims it even if broken, as in Jupyter, so a lower-priority
// spec of the same name never silently stands in for it.
func Load(dirs []string) *Catalog {
	c := &Catalog{
		dirs:  slices.Clone(dirs),
		specs: make(map[string]*Spec),
	}
	claimed := make(map[string]bool)
	for _, dir := range dirs {
		c.loadDir(dir, claimed)
	}
	c.names = slices.Sorted(maps.Keys(c.specs))
	return c
}

func (c *Catalog) loadDir(dir string, claimed map[string]bool) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		// ReadDir still returns the entries read before the error.
		c.problems = append(c.problems, Problem{Path: dir, Err: err})
	}
	for _, e := range entries {
		name := e.Name()
		if claimed[name] {
			continue
		}
		path := filepath.Join(dir, name)
		fi, err := os.Stat(path) // follows symlinks to spec directories
		if err != nil {
			c.problems = append(c.problems, Problem{Path: path, Err: err})
			continue
		}
		if !fi.IsDir() {
			continue
		}
		specPath := filepath.Join(path, specFile)
		if _, err := os.Lstat(specPath); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		claimed[name] = true
		s, err := Parse(path)
		if err != nil {
			c.problems = append(c.problems, Problem{Path: specPath, Err: err})
			continue
		}
		c.specs[s.Name] = s
	}
}

// Get returns the kernelspec called name. Like Jupyter, it lower-cases
// name first. An unknown name wraps ErrNoSuchSpec.
func (c *Catalog) Get(name string) (*Spec, error) {
	if s, ok := c.specs[strings.ToLower(name)]; ok {
		return s, nil
	}
	return nil, fmt.Errorf("%w %q", ErrNoSuchSpec, name)
}

// Names returns the kernelspec names, sorted.
func (c *Catalog) Names() []string {
	return slices.Clone(c.names)
}

// All returns the kernelspecs sorted by name.
func (c *Catalog) All() []*Spec {
	all := make([]*Spec, len(c.names))
	for i, name := range c.names {
		all[i] = c.specs[name]
	}
	return all
}

// Problems returns what Load skipped, in the order found.
func (c *Catalog) Problems() []Problem {
	return slices.Clone(c.problems)
}

// Dirs returns the directories searched, in order.
func (c *Catalog) Dirs() []string {
	return slices.Clone(c.dirs)
}

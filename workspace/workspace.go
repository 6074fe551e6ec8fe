// Package workspace owns the directories in which kernels work and every
// file operation on them: a Root (kernelgate's --workspace-root) holds one
// Workspace per context, per isolated run or per sandbox of an adapter, and
// each Workspace reads, writes, lists and removes files below itself only.
//
// Every path goes through an os.Root opened on the workspace's directory
// when it was made: "..", absolute paths, names with NUL or backslashes,
// and symbolic links that lead out (absolute ones included, whatever they
// point at) are refused, never followed. Writes are atomic (a temporary
// file in the same folder, renamed into place) and streamed.
//
// It knows nothing of kernels, contexts or HTTP: sessions decides which
// workspace a kernel works in; the gateway, MCP and the E2B adapter call
// the methods below for a caller's files.
package workspace

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Errors of file operations; the gateway maps them to status codes.
var (
	// ErrBadPath: the path is not a plain relative path ("..", absolute,
	// empty where a file is needed, NUL, backslash).
	ErrBadPath = errors.New("workspace: bad path")
	// ErrEscapes: the path leads out of the workspace through a symlink.
	ErrEscapes = errors.New("workspace: path leads out of the workspace")
	// ErrNotFound: nothing at that path.
	ErrNotFound = errors.New("workspace: no such file or folder")
	// ErrIsDir: a file was expected, or a folder was to be removed
	// without recursive.
	ErrIsDir = errors.New("workspace: is a folder")
	// ErrNotDir: a folder was expected.
	ErrNotDir = errors.New("workspace: not a folder")
	// ErrTooLarge: a write passed its limit; nothing was written.
	ErrTooLarge = errors.New("workspace: file too large")
	// ErrTooMany: a listing passed MaxList entries.
	ErrTooMany = errors.New("workspace: too many entries")
	// ErrClosed: the workspace was deleted.
	ErrClosed = errors.New("workspace: deleted")
)

// MaxList bounds the entries one List returns.
const MaxList = 100000

// Owner is the host user that files and folders made in a workspace are
// given (a sandboxed kernel's user, when the gateway runs as root).
type Owner struct{ UID, GID int }

// Root is the directory that holds the workspaces.
type Root struct {
	dir  string
	root *os.Root
	temp bool
}

// OpenRoot opens dir as the root of workspaces, making it if missing.
// Folders above a workspace stay the gateway's, searchable by others
// (0711) so that a kernel running as another user can reach its own.
func OpenRoot(dir string) (*Root, error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("workspace root: %w", err)
	}
	return openRoot(dir, false)
}

// TempRoot makes a root in the system's temporary folder; Close removes
// it with everything in it.
func TempRoot() (*Root, error) {
	dir, err := os.MkdirTemp("", "kernelgate-workspaces-")
	if err != nil {
		return nil, fmt.Errorf("workspace root: %w", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return openRoot(dir, true)
}

func openRoot(dir string, temp bool) (*Root, error) {
	abs, err := realDir(dir)
	if err != nil {
		return nil, err
	}
	r, err := os.OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("workspace root: %w", err)
	}
	return &Root{dir: abs, root: r, temp: temp}, nil
}

// realDir is dir made absolute with its symlinks resolved: the path a
// kernel is given must be the one the files are at.
func realDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(abs)
}

// Dir is the root's absolute path.
func (r *Root) Dir() string { return r.dir }

// Close closes the root; a temporary root is removed.
func (r *Root) Close() error {
	err := r.root.Close()
	if r.temp {
		if rerr := os.RemoveAll(r.dir); rerr != nil {
			return rerr
		}
	}
	return err
}

// Create returns the workspace called name (a relative path such as
// "contexts/abc"), making its folder, and the folders above it, when
// missing; a folder already there is kept with its files (a context that
// outlived a gateway restart). With owner, the workspace's folder is
// given to that user.
func (r *Root) Create(name string, owner *Owner) (*Workspace, error) {
	clean, err := CleanPath(name)
	if err != nil || clean == "." {
		return nil, errorf(ErrBadPath, "bad workspace name %q", name)
	}
	if dir := path.Dir(clean); dir != "." {
		if err := r.root.MkdirAll(dir, 0o711); err != nil {
			return nil, classify(err)
		}
	}
	if err := r.root.Mkdir(clean, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, classify(err)
	}
	wr, err := r.root.OpenRoot(clean)
	if err != nil {
		return nil, classify(err)
	}
	w := &Workspace{parent: r, name: clean, dir: r.dir + "/" + clean, root: wr, owner: owner}
	if owner != nil {
		if err := w.chown("."); err != nil {
			wr.Close()
			return nil, err
		}
	}
	return w, nil
}

// Open returns the existing workspace called name.
func (r *Root) Open(name string, owner *Owner) (*Workspace, error) {
	clean, err := CleanPath(name)
	if err != nil || clean == "." {
		return nil, errorf(ErrBadPath, "bad workspace name %q", name)
	}
	wr, err := r.root.OpenRoot(clean)
	if err != nil {
		return nil, classify(err)
	}
	return &Workspace{parent: r, name: clean, dir: r.dir + "/" + clean, root: wr, owner: owner}, nil
}

// Workspace is one workspace: a folder whose files callers read and write
// by paths relative to it.
type Workspace struct {
	parent *Root
	name   string
	dir    string
	root   *os.Root
	owner  *Owner
}

// Name is the workspace's name in its root.
func (w *Workspace) Name() string { return w.name }

// Dir is the workspace's absolute path on this host (a kernel's working
// directory).
func (w *Workspace) Dir() string { return w.dir }

// Owner is the user its files are given, or nil.
func (w *Workspace) Owner() *Owner { return w.owner }

// Close releases the workspace and keeps its files.
func (w *Workspace) Close() error { return w.root.Close() }

// Delete closes the workspace and removes its folder with everything in
// it.
func (w *Workspace) Delete() error {
	w.root.Close()
	if err := w.parent.root.RemoveAll(w.name); err != nil {
		return classify(err)
	}
	return nil
}

// Resolve returns the absolute host path of p (see CleanPath) inside the
// workspace, with p checked for a way out through symlinks.
func (w *Workspace) Resolve(p string) (string, error) {
	clean, err := CleanPath(p)
	if err != nil {
		return "", err
	}
	if _, err := w.root.Lstat(clean); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", classify(err)
	}
	if clean == "." {
		return w.dir, nil
	}
	return w.dir + "/" + clean, nil
}

// Entry describes a file, folder or symlink of a workspace.
type Entry struct {
	Name     string    // last element of Path
	Path     string    // relative to the workspace, "/"-separated
	Type     string    // "file", "dir" or "symlink"
	Size     int64     // bytes (a symlink's own size)
	Modified time.Time // last modification
}

func entryOf(p string, fi fs.FileInfo) Entry {
	e := Entry{Name: path.Base(p), Path: p, Type: "file", Size: fi.Size(), Modified: fi.ModTime()}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = "symlink"
	case fi.IsDir():
		e.Type, e.Size = "dir", 0
	}
	if p == "." {
		e.Name, e.Path = ".", ""
	}
	return e
}

// CleanPath checks a caller's path and returns it in canonical form: "/"-
// separated, relative, without empty, "." or ".." elements; "" and "."
// are the workspace itself ("."). A single trailing "/" is allowed.
func CleanPath(p string) (string, error) {
	if p == "" || p == "." || p == "./" {
		return ".", nil
	}
	if strings.HasPrefix(p, "/") {
		return "", errorf(ErrBadPath, "%q is absolute: paths are relative to the workspace", p)
	}
	if strings.ContainsAny(p, "\x00\\") {
		return "", errorf(ErrBadPath, "%q holds a NUL or a backslash", p)
	}
	p = strings.TrimSuffix(p, "/")
	for _, el := range strings.Split(p, "/") {
		switch el {
		case "", ".", "..":
			return "", errorf(ErrBadPath, "%q has an empty, . or .. element: paths stay inside the workspace", p)
		}
		if len(el) > 255 {
			return "", errorf(ErrBadPath, "a name is longer than 255 bytes")
		}
	}
	if len(p) > 4096 {
		return "", errorf(ErrBadPath, "the path is longer than 4096 bytes")
	}
	return p, nil
}

// classify maps an error of an os.Root call to this package's errors,
// keeping the original for its message.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrClosed):
		return ErrClosed
	case errors.Is(err, fs.ErrNotExist):
		return errorf(ErrNotFound, "%s: no such file or folder", pathOf(err))
	case errors.Is(err, syscall.EISDIR):
		return errorf(ErrIsDir, "%s is a folder", pathOf(err))
	case errors.Is(err, syscall.ENOTDIR):
		return errorf(ErrNotDir, "%s: not a folder", pathOf(err))
	case errors.Is(err, syscall.ELOOP), escapes(err):
		return errorf(ErrEscapes, "%s leads out of the workspace (through a symlink)", pathOf(err))
	case errors.Is(err, syscall.ENAMETOOLONG):
		return errorf(ErrBadPath, "%s: name too long", pathOf(err))
	}
	return err
}

// Error is an error of a file operation: Kind is one of the sentinels
// above, Msg says what happened to which path (relative to the workspace).
type Error struct {
	Kind error
	Msg  string
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Kind }

func errorf(kind error, format string, args ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// escapes recognises os.Root's refusal of a path that leads out of it
// (its error value is not exported).
func escapes(err error) bool {
	var pe *fs.PathError
	return errors.As(err, &pe) && pe.Err != nil && pe.Err.Error() == "path escapes from parent"
}

// pathOf is the path a path error names ("" otherwise).
func pathOf(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Path
	}
	return "the path"
}

// chown gives p to the workspace's owner, through an open descriptor (a
// path could be swapped for a symlink between a check and a chown).
func (w *Workspace) chown(p string) error {
	if w.owner == nil {
		return nil
	}
	f, err := openNoFollow(w.root, p)
	if err != nil {
		return classify(err)
	}
	defer f.Close()
	return f.Chown(w.owner.UID, w.owner.GID)
}

// Stat describes p; a symlink is followed when it stays inside.
func (w *Workspace) Stat(p string) (Entry, error) {
	clean, err := CleanPath(p)
	if err != nil {
		return Entry{}, err
	}
	fi, err := w.root.Stat(clean)
	if err != nil {
		return Entry{}, classify(err)
	}
	return entryOf(clean, fi), nil
}

// Exists reports whether something is at p (a symlink counts, wherever
// it points).
func (w *Workspace) Exists(p string) bool {
	clean, err := CleanPath(p)
	if err != nil {
		return false
	}
	_, err = w.root.Lstat(clean)
	return err == nil
}

// Mkdir makes the folder p and any folders above it that are missing.
func (w *Workspace) Mkdir(p string) (Entry, error) {
	clean, err := CleanPath(p)
	if err != nil {
		return Entry{}, err
	}
	if err := w.mkdirAll(clean); err != nil {
		return Entry{}, err
	}
	return w.Stat(clean)
}

// mkdirAll makes the folders of clean one by one, giving each one it made
// to the owner.
func (w *Workspace) mkdirAll(clean string) error {
	if clean == "." {
		return nil
	}
	parts := strings.Split(clean, "/")
	for i := range parts {
		dir := strings.Join(parts[:i+1], "/")
		err := w.root.Mkdir(dir, 0o755)
		switch {
		case err == nil:
			if err := w.chown(dir); err != nil {
				return err
			}
		case errors.Is(err, fs.ErrExist):
			fi, err := w.root.Stat(dir)
			if err != nil {
				return classify(err)
			}
			if !fi.IsDir() {
				return errorf(ErrNotDir, "%s is not a folder", dir)
			}
		default:
			return classify(err)
		}
	}
	return nil
}

// Write stores what r yields as the file p, atomically: the bytes go to a
// temporary file in p's folder, which replaces p only once complete, so
// readers see the old file or the new one, never a part. Folders above p
// are made. With limit > 0, a body longer than limit bytes fails with
// ErrTooLarge and leaves nothing behind.
func (w *Workspace) Write(p string, r io.Reader, limit int64) (Entry, error) {
	clean, err := CleanPath(p)
	if err != nil {
		return Entry{}, err
	}
	if clean == "." {
		return Entry{}, errorf(ErrBadPath, "a file needs a name")
	}
	dir := path.Dir(clean)
	if err := w.mkdirAll(dir); err != nil {
		return Entry{}, err
	}
	if fi, err := w.root.Lstat(clean); err == nil && fi.IsDir() {
		return Entry{}, errorf(ErrIsDir, "%s is a folder", clean)
	}
	tmp := path.Join(dir, ".kgupload-"+randomHex())
	f, err := w.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return Entry{}, classify(err)
	}
	done := false
	defer func() {
		if !done {
			f.Close()
			w.root.Remove(tmp)
		}
	}()
	if w.owner != nil {
		if err := f.Chown(w.owner.UID, w.owner.GID); err != nil {
			return Entry{}, err
		}
	}
	src := r
	if limit > 0 {
		src = io.LimitReader(r, limit+1)
	}
	buf := copyBufs.Get().(*[]byte)
	n, err := io.CopyBuffer(struct{ io.Writer }{f}, src, *buf)
	copyBufs.Put(buf)
	if err != nil {
		return Entry{}, err
	}
	if limit > 0 && n > limit {
		return Entry{}, errorf(ErrTooLarge, "the file is over %d bytes", limit)
	}
	if err := f.Sync(); err != nil {
		return Entry{}, err
	}
	if err := f.Close(); err != nil {
		return Entry{}, err
	}
	if err := w.root.Rename(tmp, clean); err != nil {
		return Entry{}, classify(err)
	}
	done = true
	fi, err := w.root.Lstat(clean)
	if err != nil {
		return Entry{}, classify(err)
	}
	return entryOf(clean, fi), nil
}

// CopyBufferSize is the size of the buffers files are streamed through:
// large enough that a gigabyte takes a few thousand system calls, small
// enough that many transfers at once cost little memory.
const CopyBufferSize = 256 << 10

var copyBufs = sync.Pool{New: func() any { b := make([]byte, CopyBufferSize); return &b }}

// CopyTo copies src to w through a pooled CopyBufferSize buffer.
func CopyTo(w io.Writer, src io.Reader) (int64, error) {
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	return io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{src}, *buf)
}

func randomHex() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Open opens the file p for reading; the caller closes it. A folder is
// ErrIsDir.
func (w *Workspace) Open(p string) (*os.File, Entry, error) {
	clean, err := CleanPath(p)
	if err != nil {
		return nil, Entry{}, err
	}
	f, err := w.root.Open(clean)
	if err != nil {
		return nil, Entry{}, classify(err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, Entry{}, err
	}
	if fi.IsDir() {
		f.Close()
		return nil, Entry{}, errorf(ErrIsDir, "%s is a folder", clean)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, Entry{}, errorf(ErrBadPath, "%s is not a regular file", clean)
	}
	return f, entryOf(clean, fi), nil
}

// List returns the entries of folder p ("" for the workspace), sorted by
// path; with recursive, those of every folder below it too (symlinks are
// listed, not followed).
func (w *Workspace) List(p string, recursive bool) ([]Entry, error) {
	clean, err := CleanPath(p)
	if err != nil {
		return nil, err
	}
	fi, err := w.root.Stat(clean)
	if err != nil {
		return nil, classify(err)
	}
	if !fi.IsDir() {
		return nil, errorf(ErrNotDir, "%s is not a folder", clean)
	}
	var out []Entry
	var walk func(dir string) error
	walk = func(dir string) error {
		f, err := w.root.Open(dir)
		if err != nil {
			return classify(err)
		}
		des, err := f.ReadDir(-1)
		f.Close()
		if err != nil {
			return classify(err)
		}
		sort.Slice(des, func(i, j int) bool { return des[i].Name() < des[j].Name() })
		for _, de := range des {
			rel := de.Name()
			if dir != "." {
				rel = dir + "/" + rel
			}
			info, err := de.Info()
			if err != nil {
				continue // removed meanwhile
			}
			if len(out) >= MaxList {
				return errorf(ErrTooMany, "more than %d entries: list a folder below", MaxList)
			}
			out = append(out, entryOf(rel, info))
			if recursive && de.IsDir() {
				if err := walk(rel); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(clean); err != nil {
		return nil, err
	}
	if out == nil {
		out = []Entry{}
	}
	return out, nil
}

// Remove removes the file or symlink p (never what a symlink points at),
// or the folder p with everything in it when recursive.
func (w *Workspace) Remove(p string, recursive bool) error {
	clean, err := CleanPath(p)
	if err != nil {
		return err
	}
	if clean == "." {
		return errorf(ErrBadPath, "the workspace itself cannot be removed")
	}
	fi, err := w.root.Lstat(clean)
	if err != nil {
		return classify(err)
	}
	if fi.IsDir() {
		if !recursive {
			return errorf(ErrIsDir, "%s is a folder: remove it with recursive", clean)
		}
		return classify(w.root.RemoveAll(clean))
	}
	return classify(w.root.Remove(clean))
}

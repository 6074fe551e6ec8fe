// Package workspace owns the directories in which kernels work and every
// file operation on them: a Root (kernelgate's --workspace-root) holds one
// Workspace per context, per isolated run or per sandbox of an adapter, and
// each Workspace reads, writes, lists and removes files below itself only.
//
// Every path goes through an os.Root opened on the workspace's directory
// when it was made: "..", absolute paths, names with NUL, paths deeper
// than MaxDepth, and symbolic links that lead out (absolute ones
// included, whatever they point at) are refused, never followed. Only
// regular files are read: a FIFO, socket or device is refused without
// ever waiting on it. Writes are atomic (a temporary file in the same
// folder, renamed into place) and streamed. Names that are not UTF-8 are
// shown, and taken, with \xHH escapes (see path.go), so every entry a
// listing shows can be named back.
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
			return nil, classify(err, "")
		}
	}
	if err := r.root.Mkdir(clean, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, classify(err, "")
	}
	wr, err := openDir(r.root, clean)
	if err != nil {
		return nil, classify(err, "")
	}
	w := &Workspace{parent: r, name: clean, dir: r.dir + "/" + clean, root: wr, owner: owner}
	if err := w.chown(wr); err != nil {
		wr.Close()
		return nil, err
	}
	return w, nil
}

// Open returns the existing workspace called name.
func (r *Root) Open(name string, owner *Owner) (*Workspace, error) {
	clean, err := CleanPath(name)
	if err != nil || clean == "." {
		return nil, errorf(ErrBadPath, "bad workspace name %q", name)
	}
	wr, err := openDir(r.root, clean)
	if err != nil {
		return nil, classify(err, "")
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
		return classify(err, "")
	}
	return nil
}

// Entry describes a file, folder or symlink of a workspace. Name and Path
// are in the API's form (see CleanPath): a name that is not UTF-8 has its
// odd bytes as \xHH, and Path given back to any method names the entry.
type Entry struct {
	Name     string    // last element of Path
	Path     string    // relative to the workspace, "/"-separated
	Type     string    // "file", "dir", "symlink", "fifo", "socket", "device" or "other"
	Size     int64     // bytes (a symlink's own size; 0 for a folder)
	Modified time.Time // last modification
}

// entryOf describes the file at raw, a path on disk, from fi.
func entryOf(raw string, fi fs.FileInfo) Entry {
	p := escape(raw)
	e := Entry{Name: path.Base(p), Path: p, Type: typeOf(fi.Mode()), Size: fi.Size(), Modified: fi.ModTime()}
	if e.Type != "file" && e.Type != "symlink" {
		e.Size = 0
	}
	if raw == "." {
		e.Name, e.Path = ".", ""
	}
	return e
}

// typeOf names the type of a file mode.
func typeOf(m fs.FileMode) string {
	switch t := m.Type(); {
	case t == 0:
		return "file"
	case t&fs.ModeSymlink != 0:
		return "symlink"
	case t&fs.ModeDir != 0:
		return "dir"
	case t&fs.ModeNamedPipe != 0:
		return "fifo"
	case t&fs.ModeSocket != 0:
		return "socket"
	case t&fs.ModeDevice != 0:
		return "device"
	}
	return "other"
}

// classify maps an error of an os.Root call to this package's errors,
// keeping the original for its message. raw is the path (on disk) the
// message names; "" names the one the error carries.
func classify(err error, raw string) error {
	if err == nil {
		return nil
	}
	p := escape(raw)
	if raw == "" {
		p = escape(pathOf(err))
	}
	switch {
	case errors.Is(err, fs.ErrClosed):
		return ErrClosed
	case errors.Is(err, fs.ErrNotExist):
		return errorf(ErrNotFound, "%s: no such file or folder", p)
	case errors.Is(err, syscall.EISDIR):
		return errorf(ErrIsDir, "%s is a folder", p)
	case errors.Is(err, syscall.ENOTDIR):
		return errorf(ErrNotDir, "%s: not a folder", p)
	case errors.Is(err, syscall.ELOOP), escapes(err):
		return errorf(ErrEscapes, "%s leads out of the workspace (through a symlink)", p)
	case errors.Is(err, syscall.ENAMETOOLONG):
		return errorf(ErrBadPath, "%s: name too long", p)
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
// (its error value is not exported), from a call on one path or two.
func escapes(err error) bool {
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Err != nil && pe.Err.Error() == "path escapes from parent" {
		return true
	}
	var le *os.LinkError
	return errors.As(err, &le) && le.Err != nil && le.Err.Error() == "path escapes from parent"
}

// pathOf is the path a path error names ("the path" otherwise).
func pathOf(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Path
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.New
	}
	return "the path"
}

// chown gives the folder dir is open on to the workspace's owner, through
// its descriptor (a path could be swapped between a check and a chown).
func (w *Workspace) chown(dir *os.Root) error {
	if w.owner == nil {
		return nil
	}
	return dir.Chown(".", w.owner.UID, w.owner.GID)
}

// openDir opens the folder raw of r as a root of its own. The last
// element is opened as "raw/.": every element before "." is opened as a
// folder (O_DIRECTORY), so that a FIFO swapped in for the folder is
// refused, never waited on, and "." is then the folder itself.
func openDir(r *os.Root, raw string) (*os.Root, error) {
	if raw == "." {
		return r.OpenRoot(".")
	}
	return r.OpenRoot(raw + "/.")
}

// Resolve returns the absolute host path of p (see CleanPath) inside the
// workspace, with p checked for a way out through symlinks.
func (w *Workspace) Resolve(p string) (string, error) {
	clean, err := CleanPath(p)
	if err != nil {
		return "", err
	}
	if _, err := w.root.Lstat(clean); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", classify(err, clean)
	}
	if clean == "." {
		return w.dir, nil
	}
	return w.dir + "/" + clean, nil
}

// Stat describes p; a symlink is followed when it stays inside.
func (w *Workspace) Stat(p string) (Entry, error) {
	clean, err := CleanPath(p)
	if err != nil {
		return Entry{}, err
	}
	return w.stat(clean)
}

func (w *Workspace) stat(clean string) (Entry, error) {
	fi, err := w.root.Stat(clean)
	if err != nil {
		return Entry{}, classify(err, clean)
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
	d, err := w.makeDirs(clean)
	if err != nil {
		return Entry{}, err
	}
	defer d.Close()
	fi, err := d.Stat(".")
	if err != nil {
		return Entry{}, classify(err, clean)
	}
	return entryOf(clean, fi), nil
}

// makeDirs opens the folder clean (a path on disk) as a root of its own,
// making it and the folders above it when missing and giving each one it
// makes to the owner. It goes down one element at a time, each opened
// from the one above, so the work grows with the depth, not its square;
// only a symlink that leads above the folder it is in is resolved again
// from the workspace (where it may stay inside).
func (w *Workspace) makeDirs(clean string) (*os.Root, error) {
	cur, err := openDir(w.root, ".")
	if err != nil {
		return nil, classify(err, ".")
	}
	if clean == "." {
		return cur, nil
	}
	at := 0
	for {
		end := strings.IndexByte(clean[at:], '/')
		if end < 0 {
			end = len(clean)
		} else {
			end += at
		}
		name, sofar := clean[at:end], clean[:end]
		err := cur.Mkdir(name, 0o755)
		made := err == nil
		if err != nil && !errors.Is(err, fs.ErrExist) {
			cur.Close()
			return nil, classify(err, sofar)
		}
		next, err := openDir(cur, name)
		if escapes(err) {
			next, err = openDir(w.root, sofar)
		}
		cur.Close()
		if err != nil {
			if errors.Is(err, syscall.ENOTDIR) {
				return nil, errorf(ErrNotDir, "%s is not a folder", escape(sofar))
			}
			return nil, classify(err, sofar)
		}
		if made {
			if err := w.chown(next); err != nil {
				next.Close()
				return nil, err
			}
		}
		cur = next
		if end == len(clean) {
			return cur, nil
		}
		at = end + 1
	}
}

// Write stores what r yields as the file p, atomically: the bytes go to a
// temporary file in p's folder, which replaces p only once complete, so
// readers see the old file or the new one, never a part. Folders above p
// are made. With limit > 0, a body longer than limit bytes fails with
// ErrTooLarge and leaves nothing behind.
//
// Everything after the folder is opened happens in that folder's open
// descriptor: the folder swapped for a symlink meanwhile (by a kernel)
// changes nothing, and a failed write removes its temporary file.
func (w *Workspace) Write(p string, r io.Reader, limit int64) (Entry, error) {
	clean, err := CleanPath(p)
	if err != nil {
		return Entry{}, err
	}
	if clean == "." {
		return Entry{}, errorf(ErrBadPath, "a file needs a name")
	}
	dir, base := path.Split(clean)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	d, err := w.makeDirs(dir)
	if err != nil {
		return Entry{}, err
	}
	defer d.Close()
	if fi, err := d.Lstat(base); err == nil && fi.IsDir() {
		return Entry{}, errorf(ErrIsDir, "%s is a folder", escape(clean))
	}
	tmp := ".kgupload-" + randomHex()
	f, err := d.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return Entry{}, classify(err, clean)
	}
	done := false
	defer func() {
		if !done {
			f.Close()
			d.Remove(tmp)
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
	if err := d.Rename(tmp, base); err != nil {
		return Entry{}, classify(err, clean)
	}
	done = true
	fi, err := d.Lstat(base)
	if err != nil {
		return Entry{}, classify(err, clean)
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

// Open opens the regular file p for reading; the caller closes it. A
// folder is ErrIsDir; a FIFO, socket or device is ErrBadPath, refused
// without waiting: p is checked first, then opened with O_NONBLOCK (see
// readFlags) and what was opened checked again through its descriptor, so
// that a FIFO swapped in between the two never makes the open wait for a
// writer.
func (w *Workspace) Open(p string) (*os.File, Entry, error) {
	clean, err := CleanPath(p)
	if err != nil {
		return nil, Entry{}, err
	}
	fi, err := w.root.Stat(clean)
	if err != nil {
		return nil, Entry{}, classify(err, clean)
	}
	if err := regular(clean, fi); err != nil {
		return nil, Entry{}, err
	}
	f, err := w.root.OpenFile(clean, os.O_RDONLY|readFlags, 0)
	if err != nil {
		return nil, Entry{}, classify(err, clean)
	}
	fi, err = f.Stat()
	if err == nil {
		err = regular(clean, fi)
	}
	if err != nil {
		f.Close()
		return nil, Entry{}, err
	}
	return f, entryOf(clean, fi), nil
}

// regular checks that fi, of the file at clean, is a regular file.
func regular(clean string, fi fs.FileInfo) error {
	switch {
	case fi.IsDir():
		return errorf(ErrIsDir, "%s is a folder", escape(clean))
	case !fi.Mode().IsRegular():
		return errorf(ErrBadPath, "%s is a %s, not a regular file: only files are read", escape(clean), typeOf(fi.Mode()))
	}
	return nil
}

// List returns the entries of folder p ("" for the workspace), sorted by
// path; with recursive, those of every folder below it too, down to
// MaxDepth levels from the workspace (a folder at that depth is listed,
// not entered, and listing it is ErrBadPath: every entry listed can be
// named). Symlinks are listed, not followed. More than MaxList
// entries is ErrTooMany, found out before more are read. Each folder is
// opened from the one above it, so the work grows with the entries listed.
func (w *Workspace) List(p string, recursive bool) ([]Entry, error) {
	clean, err := CleanPath(p)
	if err != nil {
		return nil, err
	}
	fi, err := w.root.Stat(clean)
	if err != nil {
		return nil, classify(err, clean)
	}
	if !fi.IsDir() {
		return nil, errorf(ErrNotDir, "%s is not a folder", escape(clean))
	}
	d, err := openDir(w.root, clean)
	if err != nil {
		return nil, classify(err, clean)
	}
	defer d.Close()
	depth := 0
	if clean != "." {
		depth = strings.Count(clean, "/") + 1
	}
	if depth >= MaxDepth {
		return nil, errorf(ErrBadPath, "%s is %d levels deep: what it holds is past the %d-level limit", escape(clean), depth, MaxDepth)
	}
	l := lister{recursive: recursive, out: []Entry{}}
	if err := l.walk(d, clean, depth); err != nil {
		return nil, err
	}
	return l.out, nil
}

// lister collects a listing.
type lister struct {
	recursive bool
	out       []Entry
}

// listBatch is how many entries a folder is read by at a time.
const listBatch = 1024

// walk lists the folder d, at raw (a path on disk) and depth levels below
// the workspace, and, when recursive, the folders below it.
func (l *lister) walk(d *os.Root, raw string, depth int) error {
	f, err := d.Open(".")
	if err != nil {
		return classify(err, raw)
	}
	var des []fs.DirEntry
	for {
		batch, err := f.ReadDir(listBatch)
		des = append(des, batch...)
		if len(l.out)+len(des) > MaxList {
			f.Close()
			return errorf(ErrTooMany, "more than %d entries: list a folder below", MaxList)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			f.Close()
			return classify(err, raw)
		}
	}
	f.Close()
	sort.Slice(des, func(i, j int) bool { return des[i].Name() < des[j].Name() })
	for _, de := range des {
		rel := de.Name()
		if raw != "." {
			rel = raw + "/" + rel
		}
		info, err := de.Info()
		if err != nil {
			continue // removed meanwhile
		}
		l.out = append(l.out, entryOf(rel, info))
		if !l.recursive || !info.IsDir() || depth+1 >= MaxDepth {
			continue
		}
		sub, err := openDir(d, de.Name())
		if err != nil {
			continue // removed or replaced meanwhile
		}
		// The folder read is the one listed, not a symlink swapped in.
		if now, err := sub.Stat("."); err != nil || !os.SameFile(now, info) {
			sub.Close()
			continue
		}
		err = l.walk(sub, rel, depth+1)
		sub.Close()
		if err != nil {
			return err
		}
	}
	return nil
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
		return classify(err, clean)
	}
	if fi.IsDir() {
		if !recursive {
			return errorf(ErrIsDir, "%s is a folder: remove it with recursive", escape(clean))
		}
		return classify(w.root.RemoveAll(clean), clean)
	}
	return classify(w.root.Remove(clean), clean)
}

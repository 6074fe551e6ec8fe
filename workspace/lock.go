package workspace

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"kernelgate/internal/flock"
)

// ErrRootInUse: another live process holds the workspace root's lock.
var ErrRootInUse = errors.New("workspace: root in use by another kernelgate")

// LockFile is the file in a workspace root whose lock says that a
// gateway owns the root.
const LockFile = ".kernelgate.lock"

// RootLock is a workspace root taken by this process: an exclusive lock
// on its LockFile (flock), held until Close or until the process ends,
// however it ends: a gateway killed with SIGKILL leaves no stale lock.
// Two gateways on one root would read and delete each other's
// workspaces (a context's folder is named by its id alone), so the second
// refuses to start, as it would on one state directory.
type RootLock struct{ f *os.File }

// LockRoot takes the workspace root dir for this process. owner says who
// takes it (its state directory), written into the file for the message
// another gateway gets. A root that another live process holds is
// ErrRootInUse.
func LockRoot(dir, owner string) (*RootLock, error) { return lockRoot(dir, owner, false) }

// ShareRoot takes the workspace root dir for this process together with
// its peers: replicas on one store share one root (each context's folder
// is its owner's, whichever replica that is), and any number of them may
// hold it at once, while a gateway of its own (LockRoot) may not beside
// them, nor they beside it (ErrRootInUse).
func ShareRoot(dir, owner string) (*RootLock, error) { return lockRoot(dir, owner, true) }

func lockRoot(dir, owner string, shared bool) (*RootLock, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("workspace root: %w", err)
	}
	defer root.Close()
	f, err := root.OpenFile(LockFile, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("workspace root: lock: %w", err)
	}
	take := flock.TryLock
	if shared {
		take = flock.TryLockShared
	}
	held, err := take(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("workspace root: lock %s: %w", filepath.Join(dir, LockFile), err)
	}
	if held {
		who, _ := io.ReadAll(io.LimitReader(f, 1024))
		f.Close()
		desc := strings.TrimSpace(string(who))
		if desc == "" {
			desc = "another process"
		}
		return nil, fmt.Errorf("%w: %s is held by %s; give each gateway a --workspace-root of its own", ErrRootInUse, dir, desc)
	}
	if shared {
		// Every replica writes the same words: none clobbers another's.
		f.Truncate(0)
		f.WriteAt([]byte("kernelgate replicas sharing this root\n"), 0)
		return &RootLock{f: f}, nil
	}
	f.Truncate(0)
	f.WriteAt([]byte(fmt.Sprintf("kernelgate pid %d (%s)\n", os.Getpid(), owner)), 0)
	return &RootLock{f: f}, nil
}

// Close releases the root.
func (l *RootLock) Close() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
)

// This file is the host user a sandboxed kernel runs as. A gateway running
// as root starts bwrap as that user (SandboxConfig.UID and GID), so the
// kernel owns nothing on the host but its own directories, and bwrap,
// being neither root nor setuid, puts the sandbox in a user namespace of
// its own. Every path bwrap mounts must then be reachable by that user:
// the kernel's directories are handed to it and the directories above
// them made searchable, hidden paths it cannot reach are left alone (it
// cannot read them anyway), and a working directory it cannot enter is an
// error at launch rather than a failing bwrap.

// nobody is the uid and gid (nobody, nogroup) of sandboxed kernels of a
// root gateway unless SandboxConfig names others.
const nobody = 65534

// sandboxUser is the host user bwrap, and so the kernel, runs as.
type sandboxUser struct {
	uid, gid int
	// switched: the gateway is root and starts bwrap as uid:gid, so the
	// kernel's directories must be handed over. Otherwise the kernel runs
	// as the gateway's own user.
	switched bool
}

// user resolves the host user of c's kernels.
func (c *SandboxConfig) user() (sandboxUser, error) {
	if c.UID < 0 || c.GID < 0 {
		return sandboxUser{}, fmt.Errorf("negative uid or gid %d:%d", c.UID, c.GID)
	}
	if euid, egid := os.Geteuid(), os.Getegid(); euid != 0 {
		if (c.UID != 0 && c.UID != euid) || (c.GID != 0 && c.GID != egid) {
			return sandboxUser{}, fmt.Errorf("user %d:%d needs a gateway running as root (it runs as %d:%d)", c.UID, c.GID, euid, egid)
		}
		return sandboxUser{uid: euid, gid: egid}, nil
	}
	u := sandboxUser{uid: c.UID, gid: c.GID, switched: true}
	if u.uid == 0 {
		u.uid = nobody
	}
	if u.gid == 0 {
		u.gid = nobody
	}
	return u, nil
}

// HostUser is the host user c's kernels run as: with switched, a user
// other than the gateway's, to whom the gateway must give the directories
// such a kernel writes.
func (c *SandboxConfig) HostUser() (uid, gid int, switched bool, err error) {
	u, err := c.user()
	return u.uid, u.gid, u.switched, err
}

func (u sandboxUser) String() string { return fmt.Sprintf("%d:%d", u.uid, u.gid) }

// handOver gives u the kernel's directories kd.Root (with everything
// below it, the connection file and the copied home seed included) and
// lets it search, but not list, the directories from kd.Root's parent up
// to runtime, which stay the gateway's: bwrap must reach kd.Root to bind
// it.
func (u sandboxUser) handOver(runtime string, kd KernelDirs) error {
	if !u.switched {
		return nil
	}
	err := filepath.WalkDir(kd.Root, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, u.uid, u.gid)
	})
	if err != nil {
		return err
	}
	for dir := filepath.Dir(kd.Root); within(dir, runtime); dir = filepath.Dir(dir) {
		if err := searchable(dir); err != nil {
			return err
		}
		if dir == filepath.Clean(runtime) {
			break
		}
	}
	return nil
}

// searchable adds search permission for group and others to dir, keeping
// its other bits: a directory of the gateway's 0700 becomes 0711.
func searchable(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	mode := fi.Mode() & (fs.ModePerm | fs.ModeSetgid | fs.ModeSticky)
	if mode&0o011 == 0o011 {
		return nil
	}
	return os.Chmod(dir, mode|0o011)
}

// onThread runs f on a locked OS thread that enter gives another identity
// and leave gives back its own before the runtime may use the thread
// again. Should leave fail the thread is never handed back: it ends with
// the goroutine, and the children started from it get their parent-death
// signal. Without a switched user onThread just runs f.
func (u sandboxUser) onThread(enter, leave, f func() error) error {
	if !u.switched {
		return f()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := enter()
		if err == nil {
			err = f()
		}
		if lerr := leave(); lerr != nil {
			errc <- errors.Join(err, lerr) // still locked: the thread ends
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// canEnter says whether the calling thread may search dir and every
// directory above it: looking up "." in dir takes just that (unlike
// faccessat2, which old kernels and some seccomp filters refuse).
func canEnter(dir string) error {
	_, err := os.Stat(dir + "/.")
	if pe, ok := err.(*fs.PathError); ok {
		return pe.Err // the caller names dir
	}
	return err
}

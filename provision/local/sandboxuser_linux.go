//go:build linux

package local

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// The sandbox user's identity on a thread (setfsuid, setresuid) and at
// exec (Credential): Linux's, as bubblewrap is.

// credential is what the gated shell, and so bwrap, is started with: u
// without supplementary groups. Nil when the gateway's own user stays.
func (u sandboxUser) credential() *syscall.Credential {
	if !u.switched {
		return nil
	}
	return &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.gid), Groups: []uint32{}}
}

// setCredential makes attr start the child as u (nothing when the
// gateway's own user stays).
func (u sandboxUser) setCredential(attr *syscall.SysProcAttr) {
	attr.Credential = u.credential()
}

// lookAs runs f on an OS thread whose file-system identity is u's: its
// fsuid and fsgid, no supplementary groups and so, with an fsuid other
// than 0, none of root's file capabilities. Paths resolve in f as they
// will for bwrap.
func (u sandboxUser) lookAs(f func() error) error {
	groups, err := unix.Getgroups() // the same on every thread
	if err != nil {
		return os.NewSyscallError("getgroups", err)
	}
	uid, gid := os.Geteuid(), os.Getegid()
	fsids := func(uid, gid int) error {
		// setfsuid and setfsgid return the previous id whether they
		// succeed or not; an invalid id (-1) reads the current one back.
		unix.SetfsgidRetGid(gid)
		unix.SetfsuidRetUid(uid)
		if g, _ := unix.SetfsgidRetGid(-1); g != gid {
			return fmt.Errorf("setfsgid %d: still %d", gid, g)
		}
		if id, _ := unix.SetfsuidRetUid(-1); id != uid {
			return fmt.Errorf("setfsuid %d: still %d", uid, id)
		}
		return nil
	}
	enter := func() error {
		// unix.Setgroups is a raw system call: this thread's groups only.
		if err := unix.Setgroups(nil); err != nil {
			return os.NewSyscallError("setgroups", err)
		}
		return fsids(u.uid, u.gid)
	}
	leave := func() error {
		if err := fsids(uid, gid); err != nil {
			return err
		}
		return os.NewSyscallError("setgroups", unix.Setgroups(groups))
	}
	return u.onThread(enter, leave, f)
}

// peerOf runs f on an OS thread whose real uid and gid are u's, its
// effective ids and capabilities unchanged: prlimit(2) on a process of u
// then needs no CAP_SYS_RESOURCE, which a root gateway in a container may
// lack.
func (u sandboxUser) peerOf(f func() error) error {
	// Raw system calls: unix.Setresuid would change every thread.
	setReal := func(uid, gid int) error {
		const keep = ^uintptr(0) // -1: unchanged
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), keep, keep); e != 0 {
			return os.NewSyscallError("setresgid", e)
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), keep, keep); e != 0 {
			return os.NewSyscallError("setresuid", e)
		}
		return nil
	}
	uid, gid := os.Getuid(), os.Getgid()
	return u.onThread(func() error { return setReal(u.uid, u.gid) }, func() error { return setReal(uid, gid) }, f)
}

//go:build unix

package k8stest

import "syscall"

// joinGroupAttr starts a process in process group pgid.
func joinGroupAttr(pgid int) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pgid: pgid}
}

package sysproc

import "syscall"

// GroupAttr starts a child as the leader of a process group of its own,
// killed with SIGKILL when the thread that started it ends.
func GroupAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

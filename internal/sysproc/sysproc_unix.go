//go:build unix

package sysproc

import "syscall"

// SignalInterrupts says whether SIGINT reaches a child (it does not on
// Windows).
const SignalInterrupts = true

// SessionAttr starts a child in a session and process group of its own,
// which does not end with this process.
func SessionAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setsid: true}
}

// Kill sends sig to the process pid, or to the process group -pid when
// pid is negative, as kill(2) does; 0 checks that the process exists
// (ESRCH when it does not).
func Kill(pid int, sig syscall.Signal) error {
	return syscall.Kill(pid, sig)
}

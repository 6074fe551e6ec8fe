//go:build unix && !linux

package sysproc

import "syscall"

// GroupAttr starts a child as the leader of a process group of its own.
// There is no parent-death signal here: the child outlives a gateway
// that is killed, not one that stops.
func GroupAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

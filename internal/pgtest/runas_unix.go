//go:build unix

package pgtest

import (
	"os/exec"
	"syscall"
)

// runAs makes cmd run as the user u.
func runAs(cmd *exec.Cmd, u ids) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.gid)}}
}

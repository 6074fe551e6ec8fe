//go:build !unix

package k8stest

import (
	"syscall"

	"kernelgate/internal/sysproc"
)

// joinGroupAttr starts a process in a group of its own: there are no
// process groups to join.
func joinGroupAttr(int) *syscall.SysProcAttr { return sysproc.GroupAttr() }

package local

import (
	"os"

	"golang.org/x/sys/unix"
)

// enterNetNS moves the calling thread into the network namespace ns.
func enterNetNS(ns *os.File) error {
	return os.NewSyscallError("setns", unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET))
}

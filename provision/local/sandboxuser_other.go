//go:build !linux

package local

import "syscall"

// There is no sandbox here (errNoSandbox), so no kernel runs as another
// user: the gateway's own user stays.

func (u sandboxUser) setCredential(*syscall.SysProcAttr) {}

func (u sandboxUser) lookAs(f func() error) error {
	if u.switched {
		return errNoSandbox
	}
	return f()
}

func (u sandboxUser) peerOf(f func() error) error {
	if u.switched {
		return errNoSandbox
	}
	return f()
}

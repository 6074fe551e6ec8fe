//go:build !linux

package local

import "os"

// enterNetNS fails: network namespaces are Linux's (and so is a sandbox,
// errNoSandbox).
func enterNetNS(*os.File) error { return errNoSandbox }

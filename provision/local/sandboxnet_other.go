//go:build !linux

package jupyter

import "os"

// enterNetNS fails: network namespaces are Linux's (and so is a sandbox,
// errNoSandbox).
func enterNetNS(*os.File) error { return errNoSandbox }

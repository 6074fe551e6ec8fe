//go:build unix

package workspace

import (
	"os"
	"syscall"
)

// openNoFollow opens p in root for reading, failing on a symlink (ELOOP):
// O_NOFOLLOW, so that no symlink can be swapped in after a check.
func openNoFollow(root *os.Root, p string) (*os.File, error) {
	return root.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
}

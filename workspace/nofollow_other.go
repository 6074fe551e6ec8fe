//go:build !unix

package workspace

import (
	"io/fs"
	"os"
	"syscall"
)

// openNoFollow opens p in root for reading, failing on a symlink (ELOOP).
// There is no O_NOFOLLOW here: an Lstat checks p first, which a symlink
// swapped in between the two calls could pass. Workspaces with an owner
// to chown to (the only caller) come with a sandbox user, which is
// Linux's.
func openNoFollow(root *os.Root, p string) (*os.File, error) {
	fi, err := root.Lstat(p)
	if err != nil {
		return nil, err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return nil, &fs.PathError{Op: "open", Path: p, Err: syscall.ELOOP}
	}
	return root.OpenFile(p, os.O_RDONLY, 0)
}

//go:build unix

package state

import (
	"os"
	"syscall"
)

// ownerUID is the user who owns the file fi describes.
func ownerUID(fi os.FileInfo) (uid int, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}

//go:build windows

package state

import "os"

// ownerUID is unknown here: Windows files have owners of another kind
// (SIDs), and the directory's ACL is the user's to set.
func ownerUID(os.FileInfo) (uid int, ok bool) { return 0, false }

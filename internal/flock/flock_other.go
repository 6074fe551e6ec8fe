//go:build !unix && !windows

package flock

import "os"

// TryLock has no file locks to take here: nothing is locked.
func TryLock(*os.File) (held bool, err error) { return false, nil }

// TryLockShared has no file locks to take here: nothing is locked.
func TryLockShared(*os.File) (held bool, err error) { return false, nil }

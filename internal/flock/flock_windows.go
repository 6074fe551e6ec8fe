//go:build windows

package flock

import (
	"errors"
	"os"

	"golang.org/x/sys/windows"
)

// TryLock takes an exclusive lock on f without waiting, on the byte bbolt
// locks (LockFileEx at offset 2^64-1); held reports that another handle
// holds it already.
func TryLock(f *os.File) (held bool, err error) {
	const all = ^uint32(0)
	ol := &windows.Overlapped{Offset: all, OffsetHigh: all}
	err = windows.LockFileEx(windows.Handle(f.Fd()), windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, ol)
	if errors.Is(err, windows.ERROR_LOCK_VIOLATION) || errors.Is(err, windows.ERROR_IO_PENDING) {
		return true, nil
	}
	return false, err
}

// TryLockShared takes a shared lock on f without waiting (LockFileEx
// without LOCKFILE_EXCLUSIVE_LOCK); held reports that another handle
// holds an exclusive one.
func TryLockShared(f *os.File) (held bool, err error) {
	const all = ^uint32(0)
	ol := &windows.Overlapped{Offset: all, OffsetHigh: all}
	err = windows.LockFileEx(windows.Handle(f.Fd()), windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, ol)
	if errors.Is(err, windows.ERROR_LOCK_VIOLATION) || errors.Is(err, windows.ERROR_IO_PENDING) {
		return true, nil
	}
	return false, err
}

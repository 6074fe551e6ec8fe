package local

import (
	"os"

	"golang.org/x/sys/unix"
)

// pidWatcher learns of a process's end from a pidfd (Linux 5.3+), which
// becomes readable when the process exits, through the runtime's poller:
// no thread waits for it.
type pidWatcher struct {
	f *os.File
}

func watchPID(pid int) (*pidWatcher, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, err
	}
	// Non-blocking, so that os.NewFile puts it in the poller.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &pidWatcher{f: os.NewFile(uintptr(fd), "pidfd")}, nil
}

// wait returns true once the process has ended, false when stop was
// called first.
func (w *pidWatcher) wait() bool {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return false
	}
	ended := false
	err = rc.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		ended = err == nil && n > 0
		return ended
	})
	return err == nil && ended
}

// stop makes wait return false: the pending read fails as the file
// closes.
func (w *pidWatcher) stop() { w.f.Close() }

func (w *pidWatcher) close() { w.f.Close() }

//go:build !linux

package local

import (
	"syscall"
	"time"

	"kernelgate/internal/sysproc"
)

// pidWatcher polls for a process's end where there is no pidfd: the pid
// may be reused meanwhile, which is why no kernel is adopted here
// (processStart is unknown), but the type keeps the package building.
type pidWatcher struct {
	pid  int
	quit chan struct{}
}

func watchPID(pid int) (*pidWatcher, error) {
	return &pidWatcher{pid: pid, quit: make(chan struct{})}, nil
}

func (w *pidWatcher) wait() bool {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-w.quit:
			return false
		case <-t.C:
			if sysproc.Kill(w.pid, 0) == syscall.ESRCH {
				return true
			}
		}
	}
}

func (w *pidWatcher) stop() {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
}

func (w *pidWatcher) close() { w.stop() }

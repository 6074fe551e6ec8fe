//go:build !linux

package local

import (
	"log/slog"
	"sync"
)

// setRlimits does nothing: the rlimits of another process are set with
// prlimit(2), which is Linux's (warnUnenforced says so).
func (l Limits) setRlimits(pid int) error { return nil }

var rlimitWarning sync.Once

// warnUnenforced logs once that the rlimits of l are not applied here.
func warnUnenforced(log *slog.Logger, l Limits) {
	if l.NoFile > 0 || l.Core > 0 {
		rlimitWarning.Do(func() {
			log.Warn("rlimits are set on Linux only: kernel open-file and core-size limits are not enforced")
		})
	}
}

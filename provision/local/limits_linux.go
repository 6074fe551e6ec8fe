package local

import (
	"fmt"
	"log/slog"
	"syscall"

	"golang.org/x/sys/unix"
)

// setRlimits applies the rlimits of l to the process pid.
func (l Limits) setRlimits(pid int) error {
	if l.NoFile > 0 {
		if err := prlimit(pid, syscall.RLIMIT_NOFILE, l.NoFile); err != nil {
			return fmt.Errorf("RLIMIT_NOFILE: %w", err)
		}
	}
	if err := prlimit(pid, syscall.RLIMIT_CORE, l.Core); err != nil {
		return fmt.Errorf("RLIMIT_CORE: %w", err)
	}
	return nil
}

// prlimit sets the soft and hard limit of resource of process pid to v.
func prlimit(pid, resource int, v uint64) error {
	return unix.Prlimit(pid, resource, &unix.Rlimit{Cur: v, Max: v}, nil)
}

// warnUnenforced tells what limits this system cannot apply: on Linux the
// rlimits always apply (cgroups warn for themselves).
func warnUnenforced(*slog.Logger, Limits) {}

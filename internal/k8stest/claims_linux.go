package k8stest

import (
	"fmt"
	"os/exec"
	"strconv"
	"syscall"
)

// mountNamespace starts the process with attr in a mount namespace of
// its own (its mounts private: nothing reaches the host's).
func mountNamespace(attr *syscall.SysProcAttr) error {
	attr.Unshareflags |= syscall.CLONE_NEWNS
	return nil
}

// inMountNamespace returns argv run in the mount namespace of process
// pid, in dir there.
func inMountNamespace(pid int, dir string, argv []string) ([]string, error) {
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return nil, fmt.Errorf("the test node enters a pod's mounts with nsenter(1): %w", err)
	}
	// nsenter's --wd opens its folder before it enters: the shell enters
	// the folder as the namespace has it.
	return append([]string{nsenter, "--target", strconv.Itoa(pid), "--mount", "--", "/bin/sh", "-c", `cd "$0" && exec "$@"`, dir}, argv...), nil
}

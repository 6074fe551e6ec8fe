//go:build !linux

package local

import (
	"context"
	"os/exec"

	"kernelgate/jupyter"
)

// Zygotes fork kernels with clone(CLONE_PARENT) and a parent-death
// signal, which are Linux's (zygote.go): elsewhere every kernel is
// exec'd, whatever PythonLauncher says.

// Python kernel launchers (Provisioner.PythonLauncher).
const (
	// LauncherFork forks Python kernels from a zygote where it can: on
	// Linux only.
	LauncherFork = "fork"
	// LauncherExec starts every kernel as a new process.
	LauncherExec = "exec"
)

// launchForked never forks here: the kernel is exec'd.
func (p *Provisioner) launchForked(context.Context, jupyter.LaunchRequest, isolation, *localProcess, []string, map[string]string, string) (jupyter.Process, error) {
	return nil, nil
}

// StopZygotes does nothing: there are no zygotes here.
func StopZygotes() {}

// startOnParentThread starts cmd: without a parent-death signal, the
// thread that starts a child does not matter.
func startOnParentThread(cmd *exec.Cmd) error { return cmd.Start() }

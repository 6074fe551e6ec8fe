//go:build !linux

package jupyter

import (
	"context"
	"os/exec"
)

// Zygotes fork kernels with clone(CLONE_PARENT) and a parent-death
// signal, which are Linux's (zygote.go): elsewhere every kernel is
// exec'd, whatever PythonLauncher says.

// Python kernel launchers (LocalProvisioner.PythonLauncher).
const (
	// LauncherFork forks Python kernels from a zygote where it can: on
	// Linux only.
	LauncherFork = "fork"
	// LauncherExec starts every kernel as a new process.
	LauncherExec = "exec"
)

// forkedProcess is a kernel forked from a zygote, which never happens
// here: the type, with the fields the rest of the package reads, keeps it
// building. Its methods are the nil Process's, never called.
type forkedProcess struct {
	Process

	ci       ConnInfo
	dir      string
	pid      int
	cg       *kernelCgroup
	detached bool
	outFile  string
	guard    *orphanGuard
	done     chan struct{}
}

// launchForked never forks here: the kernel is exec'd.
func (p *LocalProvisioner) launchForked(context.Context, LaunchRequest, isolation, *localProcess, []string, map[string]string, string) (*forkedProcess, error) {
	return nil, nil
}

// StopZygotes does nothing: there are no zygotes here.
func StopZygotes() {}

// startOnParentThread starts cmd: without a parent-death signal, the
// thread that starts a child does not matter.
func startOnParentThread(cmd *exec.Cmd) error { return cmd.Start() }

package jupyter

import (
	"context"
	"errors"

	"kernelgate/kernelspecs"
)

// Provisioner starts kernel processes and hands back how to reach them.
// The local one runs child processes; others may run kernels elsewhere, so
// nothing above a Process may assume a local PID or connection file.
//
// A gateway has several, chosen per kernelspec by a Registry
// (provisioners.go).
type Provisioner interface {
	Launch(ctx context.Context, req LaunchRequest) (Process, error)
	// Capabilities say what the provisioner does for kernels of spec
	// (nil: for any kernelspec).
	Capabilities(spec *kernelspecs.Spec) Capabilities
}

// LaunchRequest says what to start.
type LaunchRequest struct {
	KernelID string
	Spec     *kernelspecs.Spec
	// Env is added to the kernel's environment after the spec's env; it
	// comes from a client and is checked by ValidateEnv.
	Env map[string]string
	// DirEnv is added last: variables naming directories the gateway made
	// for this kernel (a context's package cache, DENO_DIR), which the
	// client deny list would refuse. Never a client's values.
	DirEnv map[string]string
	// Cwd is the kernel's working directory; empty means the provisioner's.
	Cwd string
	// StartFresh starts the kernel in its own fresh work directory even
	// when Cwd is set: Cwd is then only made reachable (writable in a
	// sandbox), and the caller moves the kernel there once it runs. Files
	// planted in Cwd then play no part in the kernel's start-up (Python
	// puts its start directory on sys.path; Deno reads a deno.json there).
	StartFresh bool
	// Options are the provisioner's own options for this kernel, opaque
	// to this package (the local provisioner's limits and sandbox); nil
	// keeps the provisioner's defaults.
	Options any
	// Kind says what the kernel serves ("jupyter" for a kernel of the
	// Jupyter API, "context" for one of the code-interpreter API); a
	// provisioner that keeps kernels where a later gateway finds them
	// records it so that only the kernels it can serve again are adopted.
	Kind string
}

// Process is one launched kernel process, as its provisioner controls it
// (jupyter_client's KernelProvisionerBase: poll and wait are Done,
// send_signal, terminate and kill are Interrupt, Terminate and Kill).
type Process interface {
	// ConnInfo is how to reach the kernel's sockets.
	ConnInfo() ConnInfo
	// Interrupt interrupts what the kernel runs by the provisioner's own
	// means (SIGINT to a local process group). It returns
	// ErrInterruptByMessage when the kernel must be interrupted by an
	// interrupt_request instead.
	Interrupt() error
	// Terminate asks the kernel to end (SIGTERM, or a pod deleted with its
	// grace period).
	Terminate() error
	// Kill ends the kernel at once (SIGKILL of its process group).
	Kill() error
	// Done is closed once the process has ended and been reaped.
	Done() <-chan struct{}
	// ExitStatus says how the process ended, once Done is closed.
	ExitStatus() string
	// ExitReason is why the process ended beyond its status, e.g. "out of
	// memory", or "" when nothing more is known. Valid once Done is closed.
	ExitReason() string
	// Output is the tail of what the kernel wrote to stdout and stderr.
	Output() string
	// Cleanup removes what the launch left behind (connection file and
	// its directory). Call it after Done.
	Cleanup() error
}

// ErrInterruptByMessage: the process cannot be interrupted by its
// provisioner (a sandbox or a pod); the interrupt goes by
// interrupt_request on the control channel.
var ErrInterruptByMessage = errors.New("jupyter: the kernel is interrupted by message")

// LocalProcess is a Process that runs on this host as a process of its
// own (for logs and tests).
type LocalProcess interface {
	PID() int
}

// StartRetrier is a Provisioner that may have a start that failed tried
// again: the local one, whose kernels bind ports of this host that
// another process may take between their choice and the kernel's bind.
// attempt counts from 1.
type StartRetrier interface {
	RetryStart(spec *kernelspecs.Spec, err error, attempt int) bool
}

// LeftoverRemover is an Adopter that can tell a kernel that is gone for
// good from one it cannot adopt for another reason and remove what the
// gone one left behind (its directory, its watchdog): Stop calls it when
// Adopt fails. It reports whether the kernel was gone.
type LeftoverRemover interface {
	RemoveLeftovers(info ProvisionerInfo) bool
}

// processID is the local process id of p, or 0.
func processID(p Process) int {
	if l, ok := p.(LocalProcess); ok {
		return l.PID()
	}
	return 0
}

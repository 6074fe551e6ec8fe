package jupyter

import (
	"context"
	"syscall"

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
	// Limits, when set, replace the provisioner's default limits.
	Limits *Limits
	// Sandbox, when set, replaces the provisioner's sandbox configuration.
	Sandbox *SandboxConfig
	// Kind says what the kernel serves ("jupyter" for a kernel of the
	// Jupyter API, "context" for one of the code-interpreter API); a
	// provisioner that keeps kernels where a later gateway finds them
	// records it so that only the kernels it can serve again are adopted.
	Kind string
}

// Process is one launched kernel process.
type Process interface {
	// ConnInfo is how to reach the kernel's sockets.
	ConnInfo() ConnInfo
	// PID is the local process id, or 0 when the kernel is not a local process.
	PID() int
	// Signal sends sig to the kernel (its whole process group when local).
	Signal(sig syscall.Signal) error
	// Done is closed once the process has ended and been reaped.
	Done() <-chan struct{}
	// ExitStatus says how the process ended, once Done is closed.
	ExitStatus() string
	// Output is the tail of what the kernel wrote to stdout and stderr.
	Output() string
	// Cleanup removes what the launch left behind (connection file and
	// its directory). Call it after Done.
	Cleanup() error
}

package jupyter

import (
	"context"
	"io"
	"syscall"
	"time"
)

// The contract of a command beside a kernel, whatever runs the kernel: a
// local process (Command, through localCommand) or a pod (the kubernetes
// provisioner's, through the exec subresource). A provisioner's Process
// that can start commands implements CommandStarter.

// CommandProc is a process started beside a kernel.
type CommandProc interface {
	// Stdout and Stderr are the command's output: read them until EOF,
	// then Close them.
	Stdout() io.ReadCloser
	Stderr() io.ReadCloser
	// Stdin is the command's input; nil unless CommandRequest.Stdin.
	Stdin() CommandInput
	// Done is closed once the process ended.
	Done() <-chan struct{}
	// ExitCode waits for Done; 128+n when signal n ended the process.
	ExitCode() int
	// Interrupt sends SIGINT, Kill SIGKILL, to its process group.
	Interrupt() error
	Kill() error
	// KilledWithKernel says, once Done is closed, whether the command
	// ended because its kernel's process (or pod) ended; it waits up to
	// wait for the kernel's end to be known.
	KilledWithKernel(wait time.Duration) bool
}

// CommandInput is the write end of a command's standard input.
type CommandInput interface {
	io.WriteCloser
	SetWriteDeadline(time.Time) error
}

// CommandStarter is implemented by a Process that starts commands beside
// its kernel.
type CommandStarter interface {
	StartCommand(ctx context.Context, req CommandRequest) (CommandProc, error)
}

// StartCommandProc starts req beside the kernel's current process,
// whichever provisioner runs it.
func (k *Kernel) StartCommandProc(ctx context.Context, req CommandRequest) (CommandProc, error) {
	if s, ok := k.proc.(CommandStarter); ok {
		return s.StartCommand(ctx, req)
	}
	c, err := k.StartCommand(ctx, req)
	if err != nil {
		return nil, err
	}
	return localCommand{c}, nil
}

// localCommand is a local Command as a CommandProc.
type localCommand struct{ c *Command }

var _ CommandProc = localCommand{}

func (l localCommand) Stdout() io.ReadCloser { return l.c.Stdout }
func (l localCommand) Stderr() io.ReadCloser { return l.c.Stderr }

func (l localCommand) Stdin() CommandInput {
	if l.c.Stdin == nil {
		return nil
	}
	return l.c.Stdin
}

func (l localCommand) Done() <-chan struct{}                    { return l.c.Done() }
func (l localCommand) ExitCode() int                            { return l.c.ExitCode() }
func (l localCommand) Interrupt() error                         { return l.c.Signal(syscall.SIGINT) }
func (l localCommand) Kill() error                              { return l.c.Signal(syscall.SIGKILL) }
func (l localCommand) KilledWithKernel(wait time.Duration) bool { return l.c.KilledWithKernel(wait) }

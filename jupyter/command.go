package jupyter

import (
	"context"
	"errors"
	"io"
	"time"
)

// A command is a process started beside a kernel by the kernel's
// provisioner: with the kernel's environment, under its limits and, for a
// sandboxed kernel, in the same sandbox. This file is the contract every
// provisioner that can start commands implements (CommandStarter).

// ErrNoCommands is returned for a kernel whose process cannot start
// commands beside it (one adopted from info that says nothing of commands,
// as an earlier version's, or one whose provisioner has no commands).
var ErrNoCommands = errors.New("jupyter: this kernel cannot run commands beside it")

// ErrNoProgram is returned for a command whose program is not found.
var ErrNoProgram = errors.New("jupyter: no such program")

// CommandRequest says what to start beside a kernel.
type CommandRequest struct {
	// Argv is the program and its arguments; Argv[0] is looked up in the
	// kernel's PATH (or Env's).
	Argv []string
	// Dir is the working directory: absolute, and inside the kernel's
	// working directory for a sandboxed kernel. Empty means the kernel's.
	Dir string
	// Env is laid over the kernel's environment. A kernel adopted after a
	// restart may not know the variables its launch request added (a
	// local kernel does not keep them): the caller lays them here again.
	Env map[string]string
	// PathFirst are folders put ahead of the PATH (Env's, else the
	// kernel's), as a kernel's setup code may have put them.
	PathFirst []string
	// Stdin gives the command a pipe for its standard input; without it
	// the command reads an empty input.
	Stdin bool
}

// Command is a process started beside a kernel.
type Command interface {
	// Stdout and Stderr are the command's output: read each until EOF
	// (which comes soon after the process ended, even when a child of it
	// holds the output open), then Close it.
	Stdout() io.ReadCloser
	Stderr() io.ReadCloser
	// Stdin is the command's input; nil unless CommandRequest.Stdin.
	Stdin() CommandInput
	// Done is closed once the process has ended (and been reaped).
	Done() <-chan struct{}
	// ExitCode waits for Done and is the command's exit status: 128 plus
	// the signal's number when a signal ended it.
	ExitCode() int
	// Interrupt sends SIGINT to the command's process group.
	Interrupt() error
	// Kill sends SIGKILL to the command's process group.
	Kill() error
	// KilledWithKernel says, once Done is closed, whether the command was
	// killed because its kernel ended; it waits up to wait for the
	// kernel's end to be known.
	KilledWithKernel(wait time.Duration) bool
}

// CommandInput is a command's standard input; its writes take deadlines.
type CommandInput interface {
	io.WriteCloser
	SetWriteDeadline(time.Time) error
}

// CommandStarter is implemented by a Process that can start commands
// beside its kernel.
type CommandStarter interface {
	StartCommand(ctx context.Context, req CommandRequest) (Command, error)
}

// StartCommand starts req beside the kernel's current process; it fails
// with ErrNoCommands when the process cannot start commands.
func (k *Kernel) StartCommand(ctx context.Context, req CommandRequest) (Command, error) {
	c, ok := k.proc.(CommandStarter)
	if !ok {
		return nil, ErrNoCommands
	}
	return c.StartCommand(ctx, req)
}

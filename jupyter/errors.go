package jupyter

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors of the package; wrapped with %w where more is known.
var (
	ErrMalformed          = errors.New("jupyter: malformed message")
	ErrInvalidSignature   = errors.New("jupyter: invalid signature")
	ErrReplayedSignature  = errors.New("jupyter: replayed signature")
	ErrUnsupportedScheme  = errors.New("jupyter: unsupported signature scheme")
	ErrKernelDied         = errors.New("jupyter: kernel died")
	ErrKernelShutdown     = errors.New("jupyter: kernel shut down")
	ErrStartFailed        = errors.New("jupyter: kernel failed to start")
	ErrNotSupported       = errors.New("jupyter: not supported by this kernel")
	ErrInterruptTimeout   = errors.New("jupyter: kernel did not answer the interrupt")
	ErrStartTimeout       = errors.New("jupyter: kernel did not become ready in time")
	ErrChannelUnsupported = errors.New("jupyter: channel cannot carry requests")
	ErrDuplicateRequest   = errors.New("jupyter: duplicate request")
	// ErrRequestDropped: the kernel went idle after a request without
	// ever answering it, and answered a later one; it is alive and keeps
	// its state.
	ErrRequestDropped = errors.New("jupyter: the kernel went idle without answering the request")
	// ErrEnvNotAllowed: a launch asked for an environment variable the
	// gateway does not pass to kernels; see ValidateEnv and EnvError.
	ErrEnvNotAllowed = errors.New("jupyter: environment variable not allowed")
)

// DiedError says how a kernel process ended and what it printed last.
// It matches ErrKernelDied with errors.Is.
type DiedError struct {
	// Status is how the process ended, e.g. "exit status 1" or
	// "signal: killed"; empty when the process was not seen to end.
	Status string
	// Output is the tail of the kernel's stdout and stderr.
	Output string
	// During says what was going on ("start", "request").
	During string
	// Reason is why the process was killed when the provisioner knows it,
	// e.g. "out of memory"; empty otherwise.
	Reason string
	// Lost names the channel whose connection ended while the process
	// still ran (it was then killed); empty when the process ended first.
	Lost string
	// Heartbeat, when set, is how long the kernel left a heartbeat
	// unanswered while it had work in flight (Config.HeartbeatTimeout):
	// it was taken for hung or cut off, and killed. Reason says so.
	Heartbeat time.Duration
}

func (e *DiedError) Error() string {
	var b strings.Builder
	b.WriteString("jupyter: kernel died")
	if e.During != "" {
		fmt.Fprintf(&b, " during %s", e.During)
	}
	switch {
	case e.Lost != "":
		fmt.Fprintf(&b, " (its %s connection ended while it ran)", e.Lost)

	case e.Status != "" && e.Reason != "":
		fmt.Fprintf(&b, " (%s: %s)", e.Reason, e.Status)
	case e.Status != "" || e.Reason != "":
		fmt.Fprintf(&b, " (%s%s)", e.Reason, e.Status)
	}
	if out := strings.TrimSpace(e.Output); out != "" {
		fmt.Fprintf(&b, ": %s", out)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrKernelDied) true.
func (e *DiedError) Is(target error) bool { return target == ErrKernelDied }

var _ error = (*DiedError)(nil)

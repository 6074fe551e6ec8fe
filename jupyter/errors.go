package jupyter

import (
	"errors"
	"fmt"
	"strings"
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
}

func (e *DiedError) Error() string {
	var b strings.Builder
	b.WriteString("jupyter: kernel died")
	if e.During != "" {
		fmt.Fprintf(&b, " during %s", e.During)
	}
	if e.Status != "" {
		fmt.Fprintf(&b, " (%s)", e.Status)
	}
	if out := strings.TrimSpace(e.Output); out != "" {
		fmt.Fprintf(&b, ": %s", out)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrKernelDied) true.
func (e *DiedError) Is(target error) bool { return target == ErrKernelDied }

var _ error = (*DiedError)(nil)

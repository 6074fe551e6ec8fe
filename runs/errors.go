package runs

import (
	"errors"
	"fmt"
)

// Errors the gateway maps to status codes.
var (
	ErrNotAwaitingInput = errors.New("runs: run is not waiting for input")
	ErrQueueFull        = errors.New("runs: run queue full")
	ErrQueueClosed      = errors.New("runs: the queue's context was deleted")
	ErrNoSuchRun        = errors.New("runs: no such run")
	// ErrNotSent: a run's code was not sent to its kernel because this
	// gateway may not act for the kernel (its lease is lost, or the
	// record naming its request could not be committed under it): the
	// replica that owns the kernel now has the run from the store.
	ErrNotSent = errors.New("runs: the run was not sent: this replica does not own its kernel")
)

// Error is an error meant for the API's caller: Msg says what happened and
// what to do; Kind is the sentinel the gateway maps to a status code.
type Error struct {
	Kind error
	Msg  string
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Kind }

// errorf returns an *Error of kind with a formatted message.
func errorf(kind error, format string, args ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

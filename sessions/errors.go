package sessions

import "errors"

// Errors the gateway maps to status codes.
var (
	ErrNoSuchKernel    = errors.New("sessions: no such kernel")
	ErrNoSuchSpec      = errors.New("sessions: no such kernelspec")
	ErrNoSuchSession   = errors.New("sessions: no such session")
	ErrTooManyKernels  = errors.New("sessions: kernel limit reached")
	ErrKernelStart     = errors.New("sessions: kernel failed to start")
	ErrKernelDead      = errors.New("sessions: kernel is dead")
	ErrKernelGone      = errors.New("sessions: kernel was deleted")
	ErrBadRequest      = errors.New("sessions: bad request")
	ErrBadChannel      = errors.New("sessions: clients may send only on shell, control and stdin")
	ErrClientClosed    = errors.New("sessions: client closed")
	ErrShuttingDown    = errors.New("sessions: gateway is shutting down")
	ErrConflict        = errors.New("sessions: conflict")
	ErrTimeout         = errors.New("sessions: timed out")
	ErrUnsupported     = errors.New("sessions: unsupported operation")
	ErrNoSuchContext   = errors.New("sessions: no such context")
	ErrNameConflict    = errors.New("sessions: name in use")
	ErrStartTimeout    = errors.New("sessions: kernel did not start in time")
	ErrInvalidEnv      = errors.New("sessions: environment variable not allowed")
	ErrInvalidLanguage = errors.New("sessions: unknown language")
)

// Package sysproc starts and signals child processes the same way on
// every system: a process group of their own, a session of their own,
// and kill(2)'s semantics for signals. The differences live in one file
// per system:
//   - Linux (sysproc_linux.go): the child also gets SIGKILL when this
//     process dies (the parent-death signal).
//   - other Unix systems (sysproc_unixother.go): no parent-death signal; a
//     child outlives a gateway that is killed.
//   - Windows (sysproc_windows.go): a new process group; Kill ends the
//     process alone (TerminateProcess), whatever the signal that ends a
//     process on Unix, and reports any other signal as unsupported:
//     Windows kernels are interrupted by message.
package sysproc

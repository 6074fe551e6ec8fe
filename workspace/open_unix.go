//go:build unix

package workspace

import "syscall"

// readFlags are added to every open of a file to read: O_NONBLOCK, so
// that a FIFO (or a device waiting for a carrier) swapped in for a file
// between a check and the open answers at once instead of waiting for a
// writer; O_NOCTTY, so that a terminal is never made the gateway's own.
// A regular file reads the same with O_NONBLOCK.
const readFlags = syscall.O_NONBLOCK | syscall.O_NOCTTY

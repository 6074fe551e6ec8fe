// Package rawio reads and writes sockets without telling the Go scheduler
// that a system call is under way.
//
// A read or write of a non-blocking socket returns at once: it either
// moves bytes or reports that it would block, and then the netpoller
// waits, as for any net.Conn. Made through the usual path, each such call
// also enters and leaves the scheduler's system-call state, and the first
// one after the process was idle wakes the runtime's monitor thread
// (sysmon), which then polls every 20 µs while the process is busy and
// hands the process's P to another thread whenever a call outlasts one of
// its polls. For a relay of small messages on a machine with few cores
// that is the larger part of the work: two thread wake-ups and a dozen
// monitor polls for every message, on cores the kernels need.
//
// Conn does the same reads and writes as raw system calls inside
// syscall.RawConn, so deadlines, closing and the netpoller behave as for
// the connection it wraps. A file copied to a Conn (its ReadFrom, which
// net/http uses for a response that io.Copy fills from a file) is left
// to the wrapped connection, which has the kernel send it (sendfile):
// for bulk data that saves the copies through the process, worth far
// more than the bookkeeping of a few hundred system calls.
//
// The raw calls are Linux's (rawio_linux.go). Elsewhere Wrap returns the
// connection unchanged, and WrapConn a Conn whose reads and writes are
// the wrapped connection's own (rawio_other.go).
package rawio

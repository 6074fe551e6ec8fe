//go:build linux

package rawio

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// Conn is a net.Conn whose Read, Write and WriteBuffers are raw system
// calls. Everything else is the wrapped connection's.
type Conn struct {
	net.Conn
	rc  syscall.RawConn
	iov []syscall.Iovec // WriteBuffers' vector; writes are serialised by rc
}

// Wrap returns c with raw reads and writes when it is a socket of package
// net (TCP or Unix), or c unchanged.
func Wrap(c net.Conn) net.Conn {
	if rc := WrapConn(c); rc != nil {
		return rc
	}
	return c
}

// WrapConn is Wrap for a caller that needs WriteBuffers: nil when c is
// not a socket of package net.
func WrapConn(c net.Conn) *Conn {
	if rc := rawConn(c); rc != nil {
		return &Conn{Conn: c, rc: rc}
	}
	return nil
}

func rawConn(c net.Conn) syscall.RawConn {
	var sc syscall.Conn
	switch c := c.(type) {
	case *net.TCPConn:
		sc = c
	case *net.UnixConn:
		sc = c
	default:
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// Read reads what the socket has, waiting for it when it has nothing.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := c.rc.Read(func(fd uintptr) bool {
		for {
			r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false
			}
			n, errno = int(r), e
			return true
		}
	})
	if err := c.result("read", err, errno); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p, waiting while the socket's buffer is full.
func (c *Conn) Write(p []byte) (int, error) {
	bufs := net.Buffers{p}
	n, err := c.writev("write", &bufs)
	return int(n), err
}

// maxIovecs is how many buffers one writev takes (IOV_MAX is 1024).
const maxIovecs = 1024

// WriteBuffers writes all of bufs with as few writev calls as the socket
// allows, consuming bufs as net.Buffers.WriteTo does.
func (c *Conn) WriteBuffers(bufs *net.Buffers) (int64, error) {
	return c.writev("writev", bufs)
}

// writev writes bufs; op names the operation in errors.
func (c *Conn) writev(op string, bufs *net.Buffers) (int64, error) {
	var n int64
	var errno syscall.Errno
	err := c.rc.Write(func(fd uintptr) bool {
		for len(*bufs) > 0 {
			iov := c.iov[:0]
			for _, b := range *bufs {
				if len(b) == 0 {
					continue
				}
				iov = append(iov, syscall.Iovec{Base: &b[0]})
				iov[len(iov)-1].SetLen(len(b))
				if len(iov) == maxIovecs {
					break
				}
			}
			c.iov = iov
			if len(iov) == 0 {
				*bufs = (*bufs)[:0]
				break
			}
			r, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
			clear(iov) // no frame stays reachable through the vector
			switch e {
			case 0:
				n += int64(r)
				consume(bufs, int64(r))
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false
			default:
				errno = e
				return true
			}
		}
		return true
	})
	return n, c.result(op, err, errno)
}

// consume drops the first n bytes of bufs, clearing the buffers it has
// written.
func consume(bufs *net.Buffers, n int64) {
	for len(*bufs) > 0 {
		l := int64(len((*bufs)[0]))
		if l > n {
			(*bufs)[0] = (*bufs)[0][n:]
			return
		}
		n -= l
		(*bufs)[0] = nil
		*bufs = (*bufs)[1:]
	}
}

// ReadFrom copies r to the connection. A file or socket of package os
// or net (alone or behind an io.LimitedReader, as net/http's responses
// and io.CopyN hand it) goes to the wrapped connection's own ReadFrom,
// which has the kernel copy it (sendfile, splice) without its bytes
// passing through the process: for a download that saves far more than
// the scheduler's bookkeeping costs for the few system calls it takes.
// Anything else is read into a buffer and written with raw writes.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok && hasDescriptor(r) {
		return rf.ReadFrom(r)
	}
	return io.Copy(writerOnly{c}, r)
}

// writerOnly hides Conn's ReadFrom from io.Copy.
type writerOnly struct{ io.Writer }

// hasDescriptor reports whether r reads a file descriptor (an *os.File,
// or a socket of package net), alone or behind an io.LimitedReader.
func hasDescriptor(r io.Reader) bool {
	if lr, ok := r.(*io.LimitedReader); ok {
		r = lr.R
	}
	_, ok := r.(syscall.Conn)
	return ok
}

// CloseWrite shuts down the writing side (net/http uses it to let a
// response reach a client whose request it did not read to the end).
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// CloseRead shuts down the reading side.
func (c *Conn) CloseRead() error {
	if cr, ok := c.Conn.(interface{ CloseRead() error }); ok {
		return cr.CloseRead()
	}
	return c.Conn.Close()
}

// result is the error of operation op: err from RawConn (closed,
// deadline), or the errno of the system call, or nil.
func (c *Conn) result(op string, err error, errno syscall.Errno) error {
	switch {
	case err != nil:
		return c.opError(op, err)
	case errno != 0:
		return c.opError(op, os.NewSyscallError(op, errno))
	}
	return nil
}

func (c *Conn) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		// RawConn reports a closed connection or a deadline as a
		// "raw-read" or "raw-write" OpError; name the operation.
		e := *oe
		e.Op = op
		return &e
	}
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// Listener wraps the connections l accepts.
type Listener struct{ net.Listener }

func (l Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return Wrap(c), nil
}

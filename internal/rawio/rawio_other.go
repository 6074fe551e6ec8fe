//go:build !linux

package rawio

import "net"

// Conn is the connection it wraps: raw system calls are Linux's only.
type Conn struct {
	net.Conn
}

// Wrap returns c unchanged.
func Wrap(c net.Conn) net.Conn { return c }

// WrapConn is Wrap for a caller that needs WriteBuffers: nil when c is
// not a socket of package net.
func WrapConn(c net.Conn) *Conn {
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
		return &Conn{Conn: c}
	}
	return nil
}

// WriteBuffers writes all of bufs, consuming them as net.Buffers.WriteTo
// does (a writev where the system has one).
func (c *Conn) WriteBuffers(bufs *net.Buffers) (int64, error) {
	return bufs.WriteTo(c.Conn)
}

// Listener is l: its connections are not wrapped.
type Listener struct{ net.Listener }

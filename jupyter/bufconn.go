package jupyter

import (
	"bufio"
	"errors"
	"net"
)

// ErrMessageTooLarge: a kernel sent a message over the size limits (all
// its frames together, or too many frames), other than output, which is
// cut instead (see Config.KeepOutput). A frame is allocated whole as soon
// as its size is read, so a kernel (or code in it) could otherwise make
// the gateway allocate any amount.
var ErrMessageTooLarge = errors.New("jupyter: kernel sent a message over the size limit")

// DefaultMaxFrame bounds a message from a kernel, all its frames
// together, when Config names no limit.
const DefaultMaxFrame = 256 << 20

// DefaultMaxFrames bounds the frames of one message from a kernel when
// Config names no limit: identities, delimiter, signature, four parts and
// the buffers.
const DefaultMaxFrames = 1024

// readBuffer is the read buffer of a kernel connection: a few small
// messages; a larger read goes around it.
const readBuffer = 4 << 10

// bufferedConn is a kernel connection whose reads are buffered: a frame's
// header and body are read apart, so a message of six frames would
// otherwise be a dozen system calls.
type bufferedConn struct {
	net.Conn
	br *bufio.Reader
}

func newBufferedConn(c net.Conn) *bufferedConn {
	return &bufferedConn{Conn: c, br: bufio.NewReaderSize(c, readBuffer)}
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.br.Read(p) }

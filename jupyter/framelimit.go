package jupyter

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
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

// limitConn wraps a kernel connection with a reader that follows the ZMTP
// framing as it passes during the handshake (zmq4 reads it and allocates
// what it reads) and refuses a frame over max bytes before anything
// allocates it. Once the connection is open (opened), the socket reads the
// frames itself and bounds them (socket.readMessage).
func limitConn(c net.Conn, max uint64) net.Conn {
	return &limitedConn{Conn: c, frameLimiter: frameLimiter{max: max, greeting: zmtpGreeting, br: bufio.NewReaderSize(c, readBuffer)}}
}

// zmtpGreeting is the length of a ZMTP 3 greeting.
const zmtpGreeting = 64

// limitedConn is a connection whose reads pass the frame limiter.
type limitedConn struct {
	net.Conn
	frameLimiter
}

func (c *limitedConn) Read(p []byte) (int, error) { return c.read(c.Conn, p) }

// opened ends the scan: the handshake is over.
func (c *limitedConn) opened() { c.open = true }

// frameLimiter follows the ZMTP framing of what is read: after the
// greeting, frames of a flags byte, a 1- or 8-byte size and a body.
type frameLimiter struct {
	max      uint64
	greeting int
	open     bool // past the handshake: reads are no longer scanned

	inHeader bool // reading a frame's size
	size     [8]byte
	sizeLen  int // bytes of size expected
	sizeHave int
	body     uint64 // body bytes left
	err      error

	// br batches reads: a frame's header and body are read apart, so a
	// message of six frames would otherwise be a dozen system calls.
	br *bufio.Reader
}

// readBuffer is the read buffer of a kernel connection: a few small
// messages; a larger read goes around it.
const readBuffer = 4 << 10

// read reads conn (through br, which wraps it) and checks what it read.
func (c *frameLimiter) read(conn net.Conn, p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.br.Read(p)
	if c.open {
		return n, err
	}
	if serr := c.scan(p[:n]); serr != nil {
		c.err = serr
		conn.Close()
		return 0, serr
	}
	return n, err
}

// scan advances the framing state over b.
func (c *frameLimiter) scan(b []byte) error {
	for len(b) > 0 {
		switch {
		case c.greeting > 0:
			k := min(c.greeting, len(b))
			c.greeting -= k
			b = b[k:]
		case c.body > 0:
			k := uint64(len(b))
			if k > c.body {
				k = c.body
			}
			c.body -= k
			b = b[k:]
		case !c.inHeader:
			flags := b[0]
			b = b[1:]
			c.inHeader, c.sizeHave = true, 0
			c.sizeLen = 1
			if flags&0x02 != 0 { // long frame
				c.sizeLen = 8
			}
		default:
			k := min(c.sizeLen-c.sizeHave, len(b))
			copy(c.size[8-c.sizeLen+c.sizeHave:], b[:k])
			c.sizeHave += k
			b = b[k:]
			if c.sizeHave < c.sizeLen {
				continue
			}
			size := binary.BigEndian.Uint64(c.size[:])
			c.size = [8]byte{}
			c.inHeader = false
			if size > c.max {
				return fmt.Errorf("%w: %d bytes, the limit is %d", ErrMessageTooLarge, size, c.max)
			}
			c.body = size
		}
	}
	return nil
}

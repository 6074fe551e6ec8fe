package jupyter

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"kernelgate/internal/rawio"
)

// dialRetry is how often a dial is retried while the kernel has not bound
// its ports yet; fine enough that start time is not quantised by it.
const dialRetry = 5 * time.Millisecond

// sendTimeout bounds a send to a kernel that stopped reading.
const sendTimeout = 30 * time.Second

// channels are the connections of one kernel client.
type channels struct {
	shell, control, stdin, iopub, hb *socket
}

// dialChannels connects DEALER sockets for shell, control and stdin (one
// identity, so the kernel routes input_request to the sender of the
// execute_request), a SUB for iopub subscribed to everything and a REQ for
// the heartbeat. It returns once every socket is connected or ctx ends;
// closing the channels is the only way to stop them after that.
func dialChannels(ctx context.Context, ci *ConnInfo, identity string, lim readLimits) (*channels, error) {
	ch := &channels{}
	// iopub first, so the subscription is in place before the first request.
	dials := []struct {
		s   **socket
		ch  Channel
		typ socketType
		id  string
	}{
		{&ch.iopub, IOPub, sockSub, ""},
		{&ch.shell, Shell, sockDealer, identity},
		{&ch.control, Control, sockDealer, identity},
		{&ch.stdin, Stdin, sockDealer, identity},
		{&ch.hb, Heartbeat, sockReq, ""},
	}
	for _, d := range dials {
		s, err := dialSocket(ctx, ci.Endpoint(d.ch), d.typ, d.id, lim)
		if err != nil {
			ch.close()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("jupyter: dial %s: %w", d.ch, err)
		}
		*d.s = s
	}
	// ZMTP 3.0 subscription: a message of 1 and the topic (everything).
	if err := ch.iopub.send([][]byte{{1}}); err != nil {
		ch.close()
		return nil, fmt.Errorf("jupyter: subscribe iopub: %w", err)
	}
	return ch, nil
}

func (c *channels) socket(ch Channel) *socket {
	switch ch {
	case Shell:
		return c.shell
	case Control:
		return c.control
	case Stdin:
		return c.stdin
	case IOPub:
		return c.iopub
	case Heartbeat:
		return c.hb
	}
	return nil
}

func (c *channels) close() {
	for _, s := range []*socket{c.iopub, c.shell, c.control, c.stdin, c.hb} {
		if s != nil {
			s.close()
		}
	}
}

// A socket is one ZMTP connection to a kernel's socket. It makes the
// connection itself (greeting, NULL security handshake, socket types
// checked: zmtp.go) and reads and writes ZMTP frames on the caller's
// goroutine: a message received is read by the goroutine that
// asked for it, and a message sent is one writev by the sender, with no
// queue or goroutine between the kernel and kernelgate, and as raw system
// calls (internal/rawio). One goroutine receives; any number may send.
type socket struct {
	conn net.Conn    // the connection, its reads buffered
	raw  *rawio.Conn // the same connection, for writes
	req  bool        // REQ: an empty delimiter frame before the message

	wmu  sync.Mutex
	hdr  []byte      // frame headers of the message being sent
	bufs net.Buffers // its headers and frames, for one writev

	rhdr [9]byte
	lim  readLimits
}

// readLimits bound what a socket reads of one message.
type readLimits struct {
	// message bounds all frames of a message together, frames their
	// number.
	message uint64
	frames  int
	// keep, when set, is what is kept of an output message larger than
	// it: the message is cut as it is read (see readCut) and its
	// signature checked with signer as its bytes pass.
	keep        uint64
	keepResults uint64 // keep for display_data and execute_result, when set
	signer      *Signer
}

// keepOf is what is kept of an output message of type typ.
func (l *readLimits) keepOf(typ MsgType) uint64 {
	if typ != StreamMsg && l.keepResults > 0 {
		return l.keepResults
	}
	return l.keep
}

// cutAbove is the size over which an output message may be cut.
func (l *readLimits) cutAbove() uint64 {
	if l.keepResults > 0 {
		return min(l.keep, l.keepResults)
	}
	return l.keep
}

// fill puts the defaults in place of unset limits.
func (l readLimits) fill() readLimits {
	if l.message == 0 {
		l.message = DefaultMaxFrame
	}
	if l.frames <= 0 {
		l.frames = DefaultMaxFrames
	}
	return l
}

// dialSocket dials endpoint until it accepts a connection or ctx ends,
// then opens a ZMTP connection of type typ and identity id over it. Every
// message read, the handshake's too, is bounded by lim before it is
// allocated.
func dialSocket(ctx context.Context, endpoint string, typ socketType, id string, lim readLimits) (*socket, error) {
	lim = lim.fill()
	network, addr, ok := strings.Cut(endpoint, "://")
	if !ok {
		return nil, fmt.Errorf("jupyter: bad endpoint %q", endpoint)
	}
	switch network {
	case "tcp":
	case "ipc":
		network = "unix"
	default:
		return nil, fmt.Errorf("jupyter: unsupported transport %q", network)
	}
	var d net.Dialer
	var nc net.Conn
	for {
		var err error
		if nc, err = d.DialContext(ctx, network, addr); err == nil {
			break
		}
		t := time.NewTimer(dialRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	raw := rawio.WrapConn(nc)
	if raw == nil { // a dial of tcp or unix always gives a socket of package net
		nc.Close()
		return nil, fmt.Errorf("jupyter: %s connection of type %T", network, nc)
	}
	s := &socket{conn: newBufferedConn(raw), raw: raw, req: typ == sockReq, lim: lim}
	// The handshake reads from the kernel: closing the connection is what
	// stops it when ctx ends first.
	stop := context.AfterFunc(ctx, func() { s.conn.Close() })
	err := s.handshake(typ, id)
	if !stop() || err != nil {
		s.conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return s, nil
}

// ZMTP 3.0 frame flags.
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// send writes the frames of one message with one writev.
func (s *socket) send(frames [][]byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.req {
		frames = append([][]byte{{}}, frames...)
	}
	// Room for every header up front, so that the slices of hdr in bufs
	// stay valid as it grows.
	hdr := slices.Grow(s.hdr[:0], 9*len(frames))
	bufs := s.bufs[:0]
	for i, f := range frames {
		var flag byte
		if i < len(frames)-1 {
			flag = flagMore
		}
		start := len(hdr)
		hdr = appendFrameHeader(hdr, flag, len(f))
		bufs = append(bufs, hdr[start:], f)
	}
	s.hdr, s.bufs = hdr, bufs
	// The write consumes its copy of the slice and clears what it wrote,
	// so s.bufs keeps no frame alive after the send.
	return s.write(&bufs)
}

// write writes bufs within sendTimeout. The deadline is cleared after:
// an armed one would wake the idle gateway when it expires.
func (s *socket) write(bufs *net.Buffers) error {
	s.raw.SetWriteDeadline(time.Now().Add(sendTimeout))
	defer s.raw.SetWriteDeadline(time.Time{})
	_, err := s.raw.WriteBuffers(bufs)
	return err
}

func appendFrameHeader(hdr []byte, flag byte, size int) []byte {
	if size > 255 {
		return binary.BigEndian.AppendUint64(append(hdr, flag|flagLong), uint64(size))
	}
	return append(hdr, flag, byte(size))
}

// recv reads the next message. A PING command is answered; other commands
// are skipped.
func (s *socket) recv() ([][]byte, error) {
	frames, _, err := s.recvCut()
	return frames, err
}

// recvCut is recv that also says what was cut of an oversized output
// message: nil when the message came whole, or the cut, whose frames carry
// the kept part and whose signature was checked as the bytes passed.
func (s *socket) recvCut() ([][]byte, *cutInfo, error) {
	for {
		frames, command, cut, err := s.readMessage()
		if err != nil {
			return nil, nil, err
		}
		if command {
			if err := s.command(frames[0]); err != nil {
				return nil, nil, err
			}
			continue
		}
		if s.req && len(frames) > 1 && len(frames[0]) == 0 {
			frames = frames[1:]
		}
		return frames, cut, nil
	}
}

// readFrameHeader reads a frame's flags and size.
func (s *socket) readFrameHeader() (flag byte, size uint64, err error) {
	h := s.rhdr[:2]
	if _, err := io.ReadFull(s.conn, h); err != nil {
		return 0, 0, err
	}
	flag, size = h[0], uint64(h[1])
	if flag&flagLong != 0 {
		// An 8-byte size: its first byte is h[1].
		if _, err := io.ReadFull(s.conn, s.rhdr[2:9]); err != nil {
			return 0, 0, err
		}
		size = binary.BigEndian.Uint64(s.rhdr[1:9])
	}
	return flag, size, nil
}

// readMessage reads the frames of one message. A message over the limits
// (its frames together, their number) is refused before the frame past
// them is allocated, unless it is output (stream, display_data,
// update_display_data, execute_result) that can be cut: that one is read on as it arrives,
// keeping what lim.keep allows (readCut).
func (s *socket) readMessage() (frames [][]byte, command bool, cut *cutInfo, err error) {
	var total uint64
	var outputType MsgType // once typed: whether the message can be cut
	typed := false
	for {
		flag, size, err := s.readFrameHeader()
		if err != nil {
			return nil, false, nil, err
		}
		total += size
		over := total > s.lim.message || total < size || len(frames) >= s.lim.frames
		if s.lim.keep > 0 && flag&flagCommand == 0 && (over || total > s.lim.cutAbove()) {
			if !typed {
				outputType, typed = cuttable(frames)
			}
			if outputType != "" {
				cut, err := s.readCut(frames, outputType, flag, size)
				return cut.frames, false, cut, err
			}
		}
		if over {
			return nil, false, nil, fmt.Errorf("%w: more than %d bytes or %d frames, the limits are %d bytes and %d frames",
				ErrMessageTooLarge, total-size, len(frames), s.lim.message, s.lim.frames)
		}
		body := make([]byte, size)
		if _, err := io.ReadFull(s.conn, body); err != nil {
			return nil, false, nil, err
		}
		frames = append(frames, body)
		command = command || flag&flagCommand != 0
		if flag&flagMore == 0 || flag&flagCommand != 0 {
			return frames, command, nil, nil
		}
	}
}

// command answers a PING (a peer with ZMTP heartbeats on) with its PONG.
func (s *socket) command(body []byte) error {
	// name length, name, 2 bytes of TTL, context
	if len(body) < 7 || string(body[:5]) != "\x04PING" {
		return nil
	}
	pong := append([]byte("\x04PONG"), body[7:]...)
	s.wmu.Lock()
	defer s.wmu.Unlock()
	hdr := appendFrameHeader(nil, flagCommand, len(pong))
	return s.write(&net.Buffers{hdr, pong})
}

// close closes the connection; a recv in progress returns an error.
func (s *socket) close() error { return s.conn.Close() }

package jupyter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
)

// The ZMTP 3.0 connection handshake with the NULL mechanism
// (https://rfc.zeromq.org/spec/23/): both peers send a greeting, then a
// READY command naming their socket type and identity. The socket reads
// the peer's READY as any other message (readMessage), so everything a
// kernel sends, handshake included, passes one frame parser and its limits.

// socketType is a ZMTP socket type, as a READY command names it.
type socketType string

const (
	sockDealer socketType = "DEALER"
	sockSub    socketType = "SUB"
	sockReq    socketType = "REQ"
)

// peers are the socket types each of ours may talk to.
var peers = map[socketType][]socketType{
	sockDealer: {"ROUTER", "DEALER", "REP"},
	sockSub:    {"PUB", "XPUB"},
	sockReq:    {"REP", "ROUTER"},
}

// ErrHandshake: a peer's ZMTP greeting or READY command was not one
// kernelgate can talk to (another protocol, another security mechanism,
// an incompatible socket type).
var ErrHandshake = errors.New("jupyter: ZMTP handshake failed")

// greeting is a ZMTP 3.0 greeting for the NULL mechanism, as a client.
var greeting = func() []byte {
	g := make([]byte, 64)
	g[0], g[9] = 0xff, 0x7f // signature
	g[10], g[11] = 3, 0     // version
	copy(g[12:32], "NULL")  // mechanism; then as-server 0 and filler
	return g
}()

// handshake opens the ZMTP connection of s as a socket of type typ with
// identity id.
func (s *socket) handshake(typ socketType, id string) error {
	// Our greeting and READY go out together: the peer reads them in turn.
	ready := appendReady(nil, typ, id)
	hdr := appendFrameHeader(nil, flagCommand, len(ready))
	if err := s.write(&net.Buffers{greeting, hdr, ready}); err != nil {
		return err
	}
	peer := make([]byte, len(greeting))
	if _, err := io.ReadFull(s.conn, peer); err != nil {
		return hungUp(err)
	}
	if peer[0] != 0xff || peer[9] != 0x7f {
		return fmt.Errorf("%w: the peer does not speak ZMTP", ErrHandshake)
	}
	if peer[10] < 3 {
		return fmt.Errorf("%w: the peer speaks ZMTP %d.%d, 3.0 or later is needed", ErrHandshake, peer[10], peer[11])
	}
	if mech := string(bytes.TrimRight(peer[12:32], "\x00")); mech != "NULL" {
		return fmt.Errorf("%w: the peer wants security mechanism %q, not NULL", ErrHandshake, mech)
	}
	frames, command, _, err := s.readMessage()
	if err != nil {
		return hungUp(err)
	}
	if !command {
		return fmt.Errorf("%w: a message before the peer's READY", ErrHandshake)
	}
	props, err := parseReady(frames[0])
	if err != nil {
		return err
	}
	pt := socketType(props["socket-type"])
	for _, ok := range peers[typ] {
		if pt == ok {
			return nil
		}
	}
	return fmt.Errorf("%w: a %s socket cannot talk to a %q socket", ErrHandshake, typ, pt)
}

// hungUp names a connection that ended during the handshake: a kernel's
// socket answers the handshake, while a socket of another type, or a
// server that does not speak ZMTP (such as a TLS server), hangs up on it.
// Either way the port is someone else's.
func hungUp(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: the peer ended the connection", ErrHandshake)
	}
	return err
}

// appendReady appends a READY command's body: its name, then the
// properties Socket-Type and Identity.
func appendReady(b []byte, typ socketType, id string) []byte {
	b = append(b, 5)
	b = append(b, "READY"...)
	for _, p := range [][2]string{{"Socket-Type", string(typ)}, {"Identity", id}} {
		b = append(b, byte(len(p[0])))
		b = append(b, p[0]...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(p[1])))
		b = append(b, p[1]...)
	}
	return b
}

// parseReady reads the properties of a READY command (names in lower
// case); an ERROR command gives its reason as the error.
func parseReady(body []byte) (map[string]string, error) {
	if len(body) < 1 || len(body) < 1+int(body[0]) {
		return nil, fmt.Errorf("%w: a command too short", ErrHandshake)
	}
	n := 1 + int(body[0])
	name := string(body[1:n])
	body = body[n:]
	switch name {
	case "READY":
	case "ERROR":
		reason := ""
		if len(body) > 0 && len(body) >= 1+int(body[0]) {
			reason = string(body[1 : 1+int(body[0])])
		}
		return nil, fmt.Errorf("%w: the peer refused: %q", ErrHandshake, reason)
	default:
		return nil, fmt.Errorf("%w: command %q where READY was expected", ErrHandshake, name)
	}
	props := map[string]string{}
	for len(body) > 0 {
		n := int(body[0])
		if len(body) < 1+n+4 {
			return nil, fmt.Errorf("%w: a READY property cut short", ErrHandshake)
		}
		key := string(bytes.ToLower(body[1 : 1+n]))
		body = body[1+n:]
		v := binary.BigEndian.Uint32(body)
		body = body[4:]
		if uint64(v) > uint64(len(body)) {
			return nil, fmt.Errorf("%w: a READY property cut short", ErrHandshake)
		}
		props[key] = string(body[:v])
		body = body[v:]
	}
	return props, nil
}

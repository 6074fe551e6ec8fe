package gateway

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"kernelgate/internal/jsonscan"
	"kernelgate/sessions"
)

// v1Protocol is the binary websocket subprotocol of jupyter_server 2.
const v1Protocol = "v1.kernel.websocket.jupyter.org"

// wsProtocol is the framing of one websocket.
type wsProtocol int

const (
	// legacyProtocol: JSON text frames, or binary frames with an offset
	// table when a message carries buffers.
	legacyProtocol wsProtocol = iota
	// v1: binary frames of channel, header, parent, metadata, content and
	// buffers with a table of little-endian uint64 offsets.
	v1
)

var errFrame = errors.New("malformed websocket frame")

// unreadableError is a message whose frame was read but whose parts were
// not: its channel and raw header let the gateway answer it.
type unreadableError struct {
	channel string
	header  []byte
	err     error
}

func (e *unreadableError) Error() string { return e.err.Error() }
func (e *unreadableError) Unwrap() error { return e.err }

// writeV1 writes the v1 frame of (ch, m) to w without copying the parts.
func writeV1(w io.Writer, ch string, m *sessions.Message) error {
	parts := make([][]byte, 0, 5+len(m.Buffers))
	parts = append(parts, []byte(ch), m.RawHeader, m.RawParent, m.RawMetadata, m.RawContent)
	parts = append(parts, m.Buffers...)
	n := len(parts) + 1
	table := make([]byte, 8*(n+1))
	binary.LittleEndian.PutUint64(table, uint64(n))
	off := uint64(len(table))
	binary.LittleEndian.PutUint64(table[8:], off)
	for i, p := range parts {
		off += uint64(len(p))
		binary.LittleEndian.PutUint64(table[8*(i+2):], off)
	}
	if _, err := w.Write(table); err != nil {
		return err
	}
	for _, p := range parts {
		if _, err := w.Write(p); err != nil {
			return err
		}
	}
	return nil
}

// decodeV1 parses a v1 frame.
func decodeV1(b []byte) (string, *sessions.Message, error) {
	if len(b) < 8 {
		return "", nil, errFrame
	}
	n := binary.LittleEndian.Uint64(b)
	if n < 6 || n > uint64(len(b))/8-1 {
		return "", nil, fmt.Errorf("%w: %d offsets", errFrame, n)
	}
	offs := make([]uint64, n)
	for i := range offs {
		offs[i] = binary.LittleEndian.Uint64(b[8*(i+1):])
	}
	if offs[0] != 8*(n+1) {
		return "", nil, fmt.Errorf("%w: first offset %d", errFrame, offs[0])
	}
	for i := 1; i < len(offs); i++ {
		if offs[i] < offs[i-1] || offs[i] > uint64(len(b)) {
			return "", nil, fmt.Errorf("%w: offset %d out of range", errFrame, i)
		}
	}
	part := func(i int) []byte { return b[offs[i]:offs[i+1]] }
	var bufs [][]byte
	for i := 5; i < len(offs)-1; i++ {
		bufs = append(bufs, part(i))
	}
	m, err := sessions.ParseMessage(part(1), part(2), part(3), part(4), bufs)
	if err != nil {
		return "", nil, &unreadableError{channel: string(part(0)), header: part(1), err: err}
	}
	return string(part(0)), m, nil
}

// legacyEnvelope is a message in the legacy JSON framing.
type legacyEnvelope struct {
	Header       json.RawMessage `json:"header"`
	ParentHeader json.RawMessage `json:"parent_header"`
	Metadata     json.RawMessage `json:"metadata"`
	Content      json.RawMessage `json:"content"`
	Channel      string          `json:"channel"`
}

// appendLegacyJSON appends the JSON of (ch, m) in the legacy framing,
// built from the raw parts without re-encoding them.
func appendLegacyJSON(dst []byte, ch string, m *sessions.Message, withBuffers bool) []byte {
	dst = append(dst, `{"header":`...)
	dst = append(dst, m.RawHeader...)
	dst = append(dst, `,"parent_header":`...)
	dst = append(dst, m.RawParent...)
	dst = append(dst, `,"metadata":`...)
	dst = append(dst, m.RawMetadata...)
	dst = append(dst, `,"content":`...)
	dst = append(dst, m.RawContent...)
	if withBuffers {
		dst = append(dst, `,"buffers":[]`...)
	}
	dst = append(dst, `,"channel":"`...)
	dst = append(dst, ch...)
	dst = append(dst, `","msg_id":`...)
	dst = jsonscan.AppendString(dst, m.Header.MsgID)
	dst = append(dst, `,"msg_type":`...)
	dst = jsonscan.AppendString(dst, string(m.Header.MsgType))
	return append(dst, '}')
}

// appendLegacyBinary appends the legacy binary framing of a message with
// buffers: uint32 count, uint32 offsets, the JSON, then the buffers.
func appendLegacyBinary(dst []byte, ch string, m *sessions.Message) []byte {
	js := appendLegacyJSON(nil, ch, m, false)
	nbufs := 1 + len(m.Buffers)
	table := make([]byte, 4*(nbufs+1))
	binary.BigEndian.PutUint32(table, uint32(nbufs))
	off := uint32(len(table))
	binary.BigEndian.PutUint32(table[4:], off)
	off += uint32(len(js))
	for i, b := range m.Buffers {
		binary.BigEndian.PutUint32(table[4*(i+2):], off)
		off += uint32(len(b))
	}
	dst = append(dst, table...)
	dst = append(dst, js...)
	for _, b := range m.Buffers {
		dst = append(dst, b...)
	}
	return dst
}

// decodeLegacyText parses a JSON text frame; a missing channel is shell.
func decodeLegacyText(b []byte) (string, *sessions.Message, error) {
	return decodeLegacyJSON(b, nil)
}

// legacyKeys are the members of legacyEnvelope, in the order of
// decodeLegacyJSON's parts.
var legacyKeys = []string{"header", "parent_header", "metadata", "content", "channel"}

func decodeLegacyJSON(b []byte, bufs [][]byte) (string, *sessions.Message, error) {
	env, ok := scanLegacy(b)
	if !ok {
		env = legacyEnvelope{}
		if err := json.Unmarshal(b, &env); err != nil {
			return "", nil, fmt.Errorf("%w: %v", errFrame, err)
		}
	}
	return legacyMessage(env, bufs)
}

// scanLegacy reads the envelope with jsonscan, without reflection: every
// request from a JSON client comes this way. ok is false for what it
// leaves to encoding/json, which reads it the same (a key in other case,
// an escape in a key or in the channel).
func scanLegacy(b []byte) (env legacyEnvelope, ok bool) {
	var parts [5][]byte
	if !jsonscan.Members(b, legacyKeys, parts[:]) {
		return env, false
	}
	env = legacyEnvelope{Header: parts[0], ParentHeader: parts[1], Metadata: parts[2], Content: parts[3]}
	if ch := parts[4]; ch != nil && string(ch) != "null" {
		s, _, ok := jsonscan.PlainString(ch, 0)
		if !ok {
			return env, false
		}
		env.Channel = string(s)
	}
	return env, true
}

// legacyMessage is the message of an envelope; a missing channel is shell.
func legacyMessage(env legacyEnvelope, bufs [][]byte) (string, *sessions.Message, error) {
	if env.Channel == "" {
		env.Channel = "shell"
	}
	m, err := sessions.ParseMessage(env.Header, env.ParentHeader, env.Metadata, env.Content, bufs)
	if err != nil {
		return "", nil, &unreadableError{channel: env.Channel, header: env.Header, err: err}
	}
	return env.Channel, m, nil
}

// decodeLegacyBinary parses a legacy binary frame.
func decodeLegacyBinary(b []byte) (string, *sessions.Message, error) {
	if len(b) < 4 {
		return "", nil, errFrame
	}
	nbufs := binary.BigEndian.Uint32(b)
	if nbufs < 1 || uint64(nbufs) > uint64(len(b))/4-1 {
		return "", nil, fmt.Errorf("%w: %d buffers", errFrame, nbufs)
	}
	offs := make([]uint32, nbufs+1)
	for i := uint32(0); i < nbufs; i++ {
		offs[i] = binary.BigEndian.Uint32(b[4*(i+1):])
	}
	offs[nbufs] = uint32(len(b))
	for i := range offs {
		if offs[i] > uint32(len(b)) || (i > 0 && offs[i] < offs[i-1]) || (i == 0 && offs[0] < 4*(nbufs+1)) {
			return "", nil, fmt.Errorf("%w: offset %d out of range", errFrame, i)
		}
	}
	var bufs [][]byte
	for i := 1; i < int(nbufs); i++ {
		bufs = append(bufs, b[offs[i]:offs[i+1]])
	}
	return decodeLegacyJSON(b[offs[0]:offs[1]], bufs)
}

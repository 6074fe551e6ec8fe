//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/websocket"

	"kernelgate/internal/jsonscan"
	"kernelgate/jupyter"
	"kernelgate/runs"

	"kernelgate/internal/timefmt"
)

// v1Protocol is jupyter_server 2's binary websocket subprotocol.
const v1Protocol = "v1.kernel.websocket.jupyter.org"

// Dates are written with microseconds (timefmt), as jupyter_client, the
// direct client and kernelgate write them: ipykernel parses such dates, so
// every client makes the kernel do the same work.

// kernelWS is a client of a gateway's kernel websocket, in the v1 binary
// framing or the legacy JSON framing. One goroutine reads frames and
// hands on what the harness looks at; one caller at a time sends.
type kernelWS struct {
	conn    *websocket.Conn
	v1      bool
	session string
	msgs    chan wsMsg
	closed  chan struct{}
	err     error
	// awaited is the msg_id of the request the client awaits (nil
	// before the first): the reader hands on only that request's
	// messages. Every client of a kernel receives all of the kernel's
	// iopub; waking the waiter for the others' would only have it drop
	// them (with 4 clients on a kernel, 12 of 17 messages an execute).
	awaited atomic.Pointer[string]
}

// wsMsg is what the harness reads of a received message.
type wsMsg struct {
	channel string
	typ     string
	parent  string // parent_header.msg_id
	state   string // execution_state of a status message
	text    string // text/plain of an execute_result
	size    int    // bytes of the content
}

// dialKernel opens the websocket of a kernel; v1 offers the v1
// subprotocol (kernelgate selects it; jupyter_server 1.23 does not).
func dialKernel(ctx context.Context, s *server, kernelID string, v1 bool) (*kernelWS, error) {
	session := uuid.NewString()
	u := "ws" + strings.TrimPrefix(s.url, "http") + "api/kernels/" + kernelID + "/channels?session_id=" + session
	d := websocket.Dialer{HandshakeTimeout: 30 * time.Second, ReadBufferSize: 64 << 10, WriteBufferSize: 16 << 10}
	if v1 {
		d.Subprotocols = []string{v1Protocol}
	}
	conn, resp, err := d.DialContext(ctx, u, http.Header{"Authorization": {"token " + s.token}})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("%s websocket: %w (status %d)", s.name, err, resp.StatusCode)
		}
		return nil, fmt.Errorf("%s websocket: %w", s.name, err)
	}
	c := &kernelWS{conn: conn, v1: conn.Subprotocol() == v1Protocol, session: session,
		msgs: make(chan wsMsg, 4096), closed: make(chan struct{})}
	if v1 && !c.v1 {
		conn.Close()
		return nil, fmt.Errorf("%s did not select the v1 subprotocol", s.name)
	}
	go c.read()
	return c, nil
}

func (c *kernelWS) Close() error { return c.conn.Close() }

// read reads each message into one buffer it keeps, as the direct
// client's socket does (gorilla's ReadMessage would grow a new one through
// io.ReadAll for every message: for 1 MiB of output, more CPU than the
// gateway spends on it, taken from the cores the kernel runs on). What it
// hands on holds no reference to the buffer.
func (c *kernelWS) read() {
	defer close(c.closed)
	var buf bytes.Buffer
	for {
		mt, r, err := c.conn.NextReader()
		if err == nil {
			buf.Reset()
			_, err = buf.ReadFrom(r)
		}
		if err != nil {
			c.err = err
			return
		}
		data := buf.Bytes()
		var m wsMsg
		var other bool
		want := c.awaited.Load()
		if c.v1 {
			m, other, err = decodeV1(data, want)
		} else if mt == websocket.TextMessage {
			m, other, err = decodeJSON(data, want)
		} else {
			continue // legacy binary frames carry buffers, which the harness never asks for
		}
		if err != nil {
			c.err = err
			return
		}
		if !other {
			c.msgs <- m
		}
	}
}

type header struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	MsgType  string `json:"msg_type"`
	Version  string `json:"version"`
}

// send sends a request on a channel and returns its msg_id.
func (c *kernelWS) send(channel, typ string, content any) (string, error) {
	id := uuid.NewString()
	c.awaited.Store(&id)
	h, err := json.Marshal(header{MsgID: id, Session: c.session, Username: "bench",
		Date: timefmt.Format(time.Now()), MsgType: typ, Version: "5.3"})
	if err != nil {
		return "", err
	}
	body, err := json.Marshal(content)
	if err != nil {
		return "", err
	}
	if c.v1 {
		return id, c.conn.WriteMessage(websocket.BinaryMessage, encodeV1(channel, h, body))
	}
	var b bytes.Buffer
	b.WriteString(`{"header":`)
	b.Write(h)
	b.WriteString(`,"parent_header":{},"metadata":{},"content":`)
	b.Write(body)
	b.WriteString(`,"channel":"`)
	b.WriteString(channel)
	b.WriteString(`","buffers":[]}`)
	return id, c.conn.WriteMessage(websocket.TextMessage, b.Bytes())
}

// outcome is what came back for a request.
type outcome struct {
	status      string // of the reply
	text        string // text/plain of the execute_result, ANSI stripped
	streamBytes int    // bytes of stream message contents
	lateBytes   int    // of which arrived after both the reply and idle
}

var errWSClosed = errors.New("websocket closed")

// execute runs code and returns once its execute_reply and its status:
// idle have arrived, and at least minStream bytes of stream content.
func (c *kernelWS) execute(ctx context.Context, code string, minStream int) (outcome, error) {
	id, err := c.send("shell", "execute_request", jupyter.NewExecute(code))
	if err != nil {
		return outcome{}, err
	}
	return c.await(ctx, id, "execute_reply", true, minStream)
}

// kernelInfo sends a kernel_info_request and waits for its reply.
func (c *kernelWS) kernelInfo(ctx context.Context) error {
	id, err := c.send("shell", "kernel_info_request", struct{}{})
	if err != nil {
		return err
	}
	_, err = c.await(ctx, id, "kernel_info_reply", false, 0)
	return err
}

// await waits for the reply of request id (and its status: idle when
// idle is set, and minStream bytes of stream output).
func (c *kernelWS) await(ctx context.Context, id, replyType string, idle bool, minStream int) (outcome, error) {
	var o outcome
	gotReply, gotIdle := false, !idle
	for !gotReply || !gotIdle || o.streamBytes < minStream {
		select {
		case m := <-c.msgs:
			if m.parent != id {
				continue
			}
			switch {
			case m.typ == replyType:
				gotReply = true
				o.status = m.state
			case m.typ == "status" && m.state == "idle":
				gotIdle = true
			case m.typ == "execute_result":
				o.text = runs.StripANSI(m.text)
			case m.typ == "stream":
				o.streamBytes += m.size
				if gotReply && gotIdle {
					o.lateBytes += m.size
				}
			}
		case <-c.closed:
			if len(c.msgs) > 0 {
				continue // what the reader handed on before it stopped
			}
			return o, fmt.Errorf("%w: %v", errWSClosed, c.err)
		case <-ctx.Done():
			return o, ctx.Err()
		}
	}
	return o, nil
}

// encodeV1 builds a v1 frame: a table of little-endian uint64 offsets,
// then channel, header, parent, metadata and content.
func encodeV1(channel string, h, content []byte) []byte {
	parts := [][]byte{[]byte(channel), h, []byte("{}"), []byte("{}"), content}
	n := len(parts) + 1
	size := 8 * (n + 1)
	for _, p := range parts {
		size += len(p)
	}
	b := make([]byte, 8*(n+1), size)
	binary.LittleEndian.PutUint64(b, uint64(n))
	off := uint64(8 * (n + 1))
	binary.LittleEndian.PutUint64(b[8:], off)
	for i, p := range parts {
		off += uint64(len(p))
		binary.LittleEndian.PutUint64(b[8*(i+2):], off)
	}
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

var errFrame = errors.New("malformed frame")

// decodeV1 reads a v1 frame; other reports a message whose parent is
// not want (when set), left unread.
func decodeV1(b []byte, want *string) (m wsMsg, other bool, err error) {
	if len(b) < 8 {
		return wsMsg{}, false, errFrame
	}
	n := binary.LittleEndian.Uint64(b)
	if n < 6 || n > uint64(len(b))/8-1 {
		return wsMsg{}, false, errFrame
	}
	var offs [8]uint64
	for i := range min(n, 6) {
		offs[i] = binary.LittleEndian.Uint64(b[8*(i+1):])
		if offs[i] > uint64(len(b)) || (i > 0 && offs[i] < offs[i-1]) {
			return wsMsg{}, false, errFrame
		}
	}
	part := func(i int) []byte { return b[offs[i]:offs[i+1]] }
	return parseParts(part(0), part(1), part(2), part(4), want)
}

var msgTypeKey, msgIDKey = []string{"msg_type"}, []string{"msg_id"}

// envelopeKeys are the members of a JSON-framed message the harness reads.
var envelopeKeys = []string{"channel", "header", "parent_header", "content"}

// decodeJSON splits the envelope with jsonscan (what encoding/json would
// give, without its reflection: the harness's parsing is the client's
// cost, not the gateway's), and with encoding/json where jsonscan gives up.
func decodeJSON(b []byte, want *string) (m wsMsg, other bool, err error) {
	var parts [4][]byte
	if jsonscan.Members(b, envelopeKeys, parts[:]) {
		if ch, _, ok := jsonscan.PlainString(parts[0], 0); ok {
			return parseParts(ch, parts[1], parts[2], parts[3], want)
		}
	}
	var env struct {
		Channel string          `json:"channel"`
		Header  json.RawMessage `json:"header"`
		Parent  json.RawMessage `json:"parent_header"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return wsMsg{}, false, err
	}
	return parseParts([]byte(env.Channel), env.Header, env.Parent, env.Content, want)
}

// parseParts reads the fields the harness needs; it leaves a stream's
// text unparsed and counts its bytes.
// The header and parent header are read with jsonscan (encoding/json
// where it gives up), as the gateway reads them: with 64 websockets each
// receiving every message of its kernel, the harness's parsing would
// otherwise take a good share of the cores the kernels need.
func parseParts(channel, h, parent, content []byte, want *string) (m wsMsg, other bool, err error) {
	var hd struct {
		MsgType string `json:"msg_type"`
	}
	var p struct {
		MsgID string `json:"msg_id"`
	}
	if len(parent) > 2 && !jsonscan.Strings(parent, msgIDKey, []*string{&p.MsgID}) {
		if err := json.Unmarshal(parent, &p); err != nil {
			return wsMsg{}, false, err
		}
	}
	if want != nil && p.MsgID != *want {
		return wsMsg{}, true, nil
	}
	if !jsonscan.Strings(h, msgTypeKey, []*string{&hd.MsgType}) {
		if err := json.Unmarshal(h, &hd); err != nil {
			return wsMsg{}, false, err
		}
	}
	m = wsMsg{channel: string(channel), typ: hd.MsgType, parent: p.MsgID, size: len(content)}
	switch {
	case m.typ == "status":
		var s struct {
			State string `json:"execution_state"`
		}
		json.Unmarshal(content, &s)
		m.state = s.State
	case m.typ == "execute_result":
		var r struct {
			Data map[string]json.RawMessage `json:"data"`
		}
		json.Unmarshal(content, &r)
		json.Unmarshal(r.Data["text/plain"], &m.text)
	case strings.HasSuffix(m.typ, "_reply"):
		var r struct {
			Status string `json:"status"`
		}
		json.Unmarshal(content, &r)
		m.state = r.Status
	}
	return m, false, nil
}

// wrong reports whether a `1+1` outcome is not the expected one. A
// missing result is not wrong: Deno publishes some execute_results after
// its status: idle, and the round trip ends at reply and idle.
func (o outcome) wrong(want string) bool {
	return o.status != "ok" || (o.text != "" && o.text != want)
}

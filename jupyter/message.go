package jupyter

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"kernelgate/internal/jsonscan"

	"kernelgate/internal/timefmt"
)

// ProtocolVersion is the messaging protocol version kernelgate speaks.
const ProtocolVersion = "5.3"

// Channel names one of a kernel's sockets.
type Channel uint8

// The channels of a kernel connection.
const (
	Shell Channel = iota + 1
	Control
	Stdin
	IOPub
	Heartbeat
)

var channelNames = [...]string{Shell: "shell", Control: "control", Stdin: "stdin", IOPub: "iopub", Heartbeat: "hb"}

func (c Channel) String() string {
	if int(c) < len(channelNames) && channelNames[c] != "" {
		return channelNames[c]
	}
	return fmt.Sprintf("channel(%d)", uint8(c))
}

// ParseChannel returns the channel with the given protocol name.
func ParseChannel(s string) (Channel, bool) {
	for c, n := range channelNames {
		if n != "" && n == s {
			return Channel(c), true
		}
	}
	return 0, false
}

// MsgType is a message's header.msg_type.
type MsgType string

// Message types kernelgate handles by name.
const (
	KernelInfoRequest MsgType = "kernel_info_request"
	KernelInfoReply   MsgType = "kernel_info_reply"
	ExecuteRequest    MsgType = "execute_request"
	ExecuteReply      MsgType = "execute_reply"
	ExecuteInput      MsgType = "execute_input"
	ExecuteResult     MsgType = "execute_result"
	StreamMsg         MsgType = "stream"
	DisplayData       MsgType = "display_data"
	UpdateDisplayData MsgType = "update_display_data"
	ClearOutput       MsgType = "clear_output"
	ErrorMsg          MsgType = "error"
	StatusMsg         MsgType = "status"
	InputRequest      MsgType = "input_request"
	InputReply        MsgType = "input_reply"
	InterruptRequest  MsgType = "interrupt_request"
	InterruptReply    MsgType = "interrupt_reply"
	ShutdownRequest   MsgType = "shutdown_request"
	ShutdownReply     MsgType = "shutdown_reply"
	IOPubWelcome      MsgType = "iopub_welcome"
)

// IsRequest reports whether t is a request that the kernel answers with a reply.
func (t MsgType) IsRequest() bool { return strings.HasSuffix(string(t), "_request") }

// Reply is the type of the reply to request type t ("" when t is no request).
func (t MsgType) Reply() MsgType {
	if !t.IsRequest() {
		return ""
	}
	return MsgType(strings.TrimSuffix(string(t), "_request") + "_reply")
}

// IsReply reports whether t is a reply to a request.
func (t MsgType) IsReply() bool { return strings.HasSuffix(string(t), "_reply") }

// ExecutionState is the content of a status message.
type ExecutionState string

// Kernel execution states published on iopub, plus the ones a gateway adds.
const (
	StateStarting   ExecutionState = "starting"
	StateIdle       ExecutionState = "idle"
	StateBusy       ExecutionState = "busy"
	StateRestarting ExecutionState = "restarting"
	StateDead       ExecutionState = "dead"
)

// Header is a message header.
type Header struct {
	MsgID    string  `json:"msg_id"`
	Session  string  `json:"session"`
	Username string  `json:"username"`
	Date     string  `json:"date"`
	MsgType  MsgType `json:"msg_type"`
	Version  string  `json:"version"`
}

// parentRef is the part of a parent header used for routing.
type parentRef struct {
	MsgID   string  `json:"msg_id"`
	MsgType MsgType `json:"msg_type"`
}

// Message is one Jupyter message. The Raw parts are what travels on the
// wire; Header, ParentID and ParentType are parsed from them for routing.
type Message struct {
	Identities [][]byte
	Header     Header
	ParentID   string
	ParentType MsgType

	RawHeader   []byte
	RawParent   []byte
	RawMetadata []byte
	RawContent  []byte
	Buffers     [][]byte

	// Cut is how many bytes of the kernel's message were dropped as it
	// was read: output over Config.KeepOutput keeps its head and tail
	// with a marker between them in its content, or only the marker.
	Cut int64

	// state is a status message's execution_state, read once by Decode:
	// the kernel client and the sessions above both look at it.
	state ExecutionState
}

// Type returns the message type.
func (m *Message) Type() MsgType { return m.Header.MsgType }

// DecodeContent unmarshals the content into v.
func (m *Message) DecodeContent(v any) error {
	if err := json.Unmarshal(m.RawContent, v); err != nil {
		return fmt.Errorf("%w: %s content: %v", ErrMalformed, m.Header.MsgType, err)
	}
	return nil
}

// Size is the number of bytes of the message's parts.
func (m *Message) Size() int {
	n := len(m.RawHeader) + len(m.RawParent) + len(m.RawMetadata) + len(m.RawContent)
	for _, b := range m.Buffers {
		n += len(b)
	}
	return n
}

var emptyObject = []byte("{}")

// NewMessage builds a message of type t in session with content (marshalled
// to JSON; nil means {}). parent, when non-nil, becomes the parent header.
func NewMessage(session string, t MsgType, content any, parent *Message) (*Message, error) {
	h := Header{
		MsgID:    uuid.NewString(),
		Session:  session,
		Username: "kernelgate",
		Date:     timefmt.Format(time.Now()),
		MsgType:  t,
		Version:  ProtocolVersion,
	}
	rh, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	rc := emptyObject
	if content != nil {
		if rc, err = json.Marshal(content); err != nil {
			return nil, fmt.Errorf("jupyter: %s content: %w", t, err)
		}
	}
	m := &Message{Header: h, RawHeader: rh, RawParent: emptyObject, RawMetadata: emptyObject, RawContent: rc}
	if parent != nil {
		m.RawParent = parent.RawHeader
		m.ParentID = parent.Header.MsgID
		m.ParentType = parent.Header.MsgType
	}
	return m, nil
}

// ParseParts builds a message from raw JSON parts, as a websocket client
// sends them. header must carry msg_id and msg_type; every part must be a
// JSON object (parent may also be empty or null).
func ParseParts(header, parent, metadata, content []byte, buffers [][]byte) (*Message, error) {
	m := &Message{RawHeader: header, RawParent: parent, RawMetadata: metadata, RawContent: content, Buffers: buffers}
	if len(m.RawParent) == 0 || string(m.RawParent) == "null" {
		m.RawParent = emptyObject
	}
	if len(m.RawMetadata) == 0 || string(m.RawMetadata) == "null" {
		m.RawMetadata = emptyObject
	}
	if len(m.RawContent) == 0 || string(m.RawContent) == "null" {
		m.RawContent = emptyObject
	}
	for _, p := range [][]byte{m.RawMetadata, m.RawContent} {
		if !isJSONObject(p) || !jsonscan.Valid(p) {
			return nil, fmt.Errorf("%w: a part is not a JSON object", ErrMalformed)
		}
	}
	if err := m.parseHeaders(); err != nil {
		return nil, err
	}
	return m, nil
}

// decodeParent reads the parent header's msg_id and msg_type into
// ParentID and ParentType. Jupyter Server forwards any parent header: one
// whose msg_id or msg_type is not a string routes as one without them.
func decodeParent(b []byte, m *Message) error {
	var p parentRef
	if jsonscan.Strings(b, parentKeys, []*string{&p.MsgID, (*string)(&p.MsgType)}) {
		m.ParentID, m.ParentType = p.MsgID, p.MsgType
		return nil
	}
	var v struct {
		MsgID   any `json:"msg_id"`
		MsgType any `json:"msg_type"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	m.ParentID, _ = v.MsgID.(string)
	t, _ := v.MsgType.(string)
	m.ParentType = MsgType(t)
	return nil
}

// HeaderOf is what can be read of the header of a client's message that
// could not be parsed, to answer it with: a message whose RawHeader is the
// header when that is a JSON object ({} otherwise), with the header's
// msg_id and msg_type when they are strings.
func HeaderOf(header []byte) *Message {
	m := &Message{RawHeader: emptyObject}
	if !isJSONObject(header) || !jsonscan.Valid(header) {
		return m
	}
	m.RawHeader = header
	var v struct {
		MsgID   any `json:"msg_id"`
		MsgType any `json:"msg_type"`
	}
	if json.Unmarshal(header, &v) == nil {
		m.Header.MsgID, _ = v.MsgID.(string)
		t, _ := v.MsgType.(string)
		m.Header.MsgType = MsgType(t)
	}
	return m
}

// parseHeaders fills Header, ParentID and ParentType from the raw parts.
func (m *Message) parseHeaders() error {
	if !isJSONObject(m.RawHeader) {
		return fmt.Errorf("%w: header is not a JSON object", ErrMalformed)
	}
	if err := decodeHeader(m.RawHeader, &m.Header); err != nil {
		return fmt.Errorf("%w: header: %v", ErrMalformed, err)
	}
	if m.Header.MsgID == "" || m.Header.MsgType == "" {
		return fmt.Errorf("%w: header without msg_id or msg_type", ErrMalformed)
	}
	if !isJSONObject(m.RawParent) {
		return fmt.Errorf("%w: parent header is not a JSON object", ErrMalformed)
	}
	if len(m.RawParent) > 2 {
		if err := decodeParent(m.RawParent, m); err != nil {
			return fmt.Errorf("%w: parent header: %v", ErrMalformed, err)
		}
	}
	return nil
}

// decodeHeader reads a header as Jupyter Server takes it: msg_id and
// msg_type must be strings, the other members may hold any JSON value (a
// date in epoch seconds, as jupyter_server's GatewayKernelClient sends it,
// or a null username) and are then left empty here. The raw header goes to
// the kernel unchanged, as Jupyter Server sends it.
func decodeHeader(b []byte, h *Header) error {
	fields := []*string{&h.MsgID, &h.Session, &h.Username, &h.Date, (*string)(&h.MsgType), &h.Version}
	if jsonscan.Strings(b, headerKeys, fields) {
		return nil
	}
	*h = Header{}
	var v struct {
		MsgID    json.RawMessage `json:"msg_id"`
		Session  json.RawMessage `json:"session"`
		Username json.RawMessage `json:"username"`
		Date     json.RawMessage `json:"date"`
		MsgType  json.RawMessage `json:"msg_type"`
		Version  json.RawMessage `json:"version"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	for i, raw := range []json.RawMessage{v.MsgID, v.Session, v.Username, v.Date, v.MsgType, v.Version} {
		routed := i == 0 || i == 4 // msg_id, msg_type
		switch {
		case len(raw) > 0 && raw[0] == '"':
			if err := json.Unmarshal(raw, fields[i]); err != nil {
				return err
			}
		case routed && len(raw) > 0 && string(raw) != "null":
			return fmt.Errorf("%s is not a string", headerKeys[i])
		}
	}
	return nil
}

// The JSON names of Header's and parentRef's fields, in field order.
var (
	headerKeys = []string{"msg_id", "session", "username", "date", "msg_type", "version"}
	parentKeys = []string{"msg_id", "msg_type"}
	stateKeys  = []string{"execution_state"}
)

// ExecutionState is the execution_state of a status message ("" for other
// messages and for a status without one).
func (m *Message) ExecutionState() ExecutionState {
	if m.Header.MsgType != StatusMsg {
		return ""
	}
	if m.state != "" {
		return m.state
	}
	return readState(m.RawContent)
}

// readState reads the execution_state of a status message's content.
func readState(content []byte) ExecutionState {
	var s struct {
		State ExecutionState `json:"execution_state"`
	}
	if decodeFlat(content, &s, stateKeys, []*string{(*string)(&s.State)}) != nil {
		return ""
	}
	return s.State
}

// isJSONObject is a cheap structural check: the part starts with '{' and
// ends with '}' after trimming JSON whitespace.
func isJSONObject(b []byte) bool {
	i, j := 0, len(b)-1
	for i <= j && jsonscan.IsSpace(b[i]) {
		i++
	}
	for j >= i && jsonscan.IsSpace(b[j]) {
		j--
	}
	return j > i && b[i] == '{' && b[j] == '}'
}

package sessions

import "kernelgate/jupyter"

// The protocol types the gateway handles, re-exported so that it needs
// no import of package jupyter.
type (
	// Message is one Jupyter message with its raw JSON parts.
	Message = jupyter.Message
	// Channel names a kernel socket.
	Channel = jupyter.Channel
	// MsgType is a message's header.msg_type.
	MsgType = jupyter.MsgType
)

// The channels a client sees.
const (
	Shell   = jupyter.Shell
	Control = jupyter.Control
	Stdin   = jupyter.Stdin
	IOPub   = jupyter.IOPub
)

// ParseChannel returns the channel with the given protocol name.
func ParseChannel(s string) (Channel, bool) { return jupyter.ParseChannel(s) }

// ParseMessage builds a message from a client's raw JSON parts.
func ParseMessage(header, parent, metadata, content []byte, buffers [][]byte) (*Message, error) {
	m, err := jupyter.ParseParts(header, parent, metadata, content, buffers)
	if err != nil {
		return nil, errorf(ErrBadRequest, "%v", err)
	}
	return m, nil
}

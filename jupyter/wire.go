package jupyter

import (
	"bytes"
	"fmt"
)

// delimiter separates routing identities from the message parts.
var delimiter = []byte("<IDS|MSG>")

// MaxIdentities bounds the routing prefix a decoded message may carry.
const MaxIdentities = 64

// Decode parses wire frames
//
//	[identities…, <IDS|MSG>, signature, header, parent_header, metadata, content, buffers…]
//
// verifying the signature with s. Frames are not copied: the message
// refers to them. Malformed input is an error, never a panic.
func Decode(frames [][]byte, s *Signer) (*Message, error) { return decode(frames, s) }

// decode is Decode; a nil s checks no signature.
func decode(frames [][]byte, s *Signer) (*Message, error) {
	i := 0
	for ; i < len(frames) && !bytes.Equal(frames[i], delimiter); i++ {
		if i >= MaxIdentities {
			return nil, fmt.Errorf("%w: no delimiter in the first %d frames", ErrMalformed, MaxIdentities)
		}
	}
	if i == len(frames) {
		return nil, fmt.Errorf("%w: no delimiter", ErrMalformed)
	}
	if len(frames) < i+6 {
		return nil, fmt.Errorf("%w: %d frames after the delimiter, want at least 5", ErrMalformed, len(frames)-i-1)
	}
	parts := [4][]byte{frames[i+2], frames[i+3], frames[i+4], frames[i+5]}
	if s != nil {
		if err := s.Verify(frames[i+1], &parts); err != nil {
			return nil, err
		}
	}
	m := &Message{
		RawHeader:   parts[0],
		RawParent:   parts[1],
		RawMetadata: parts[2],
		RawContent:  parts[3],
	}
	if i > 0 {
		m.Identities = frames[:i:i]
	}
	if len(frames) > i+6 {
		m.Buffers = frames[i+6:]
	}
	if !isJSONObject(m.RawMetadata) || !isJSONObject(m.RawContent) {
		return nil, fmt.Errorf("%w: metadata or content is not a JSON object", ErrMalformed)
	}
	if err := m.parseHeaders(); err != nil {
		return nil, err
	}
	if m.Header.MsgType == StatusMsg {
		m.state = readState(m.RawContent)
	}
	return m, nil
}

// decodeCut parses the frames of a message readCut cut, whose signature
// it checked as the bytes passed.
func decodeCut(frames [][]byte, cut *cutInfo) (*Message, error) {
	if cut.err != nil {
		return nil, cut.err
	}
	m, err := decode(frames, nil)
	if err != nil {
		return nil, err
	}
	m.Cut = cut.dropped
	return m, nil
}

// Encode returns the wire frames of m, signed with s.
func Encode(m *Message, s *Signer) [][]byte {
	parts := [4][]byte{m.RawHeader, m.RawParent, m.RawMetadata, m.RawContent}
	for i, p := range parts {
		if len(p) == 0 {
			parts[i] = emptyObject
		}
	}
	frames := make([][]byte, 0, len(m.Identities)+6+len(m.Buffers))
	frames = append(frames, m.Identities...)
	frames = append(frames, delimiter, s.Sign(&parts))
	frames = append(frames, parts[:]...)
	return append(frames, m.Buffers...)
}

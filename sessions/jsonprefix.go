package sessions

import (
	"bytes"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// streamPrefix reads a stream message's content without decoding all of
// its text: the name, the first max bytes of the text, and how many bytes
// of text there are in all. A kernel may send hundreds of megabytes in one
// message; this keeps the gateway from copying what it will drop.
func streamPrefix(raw []byte, max int) (name, prefix string, total int, ok bool) {
	switch {
	case bytes.Contains(raw, []byte(`"name": "stdout"`)), bytes.Contains(raw, []byte(`"name":"stdout"`)):
		name = "stdout"
	case bytes.Contains(raw, []byte(`"name": "stderr"`)), bytes.Contains(raw, []byte(`"name":"stderr"`)):
		name = "stderr"
	default:
		return "", "", 0, false
	}
	i := bytes.Index(raw, []byte(`"text"`))
	if i < 0 {
		return "", "", 0, false
	}
	i += len(`"text"`)
	for i < len(raw) && (raw[i] == ' ' || raw[i] == ':' || raw[i] == '\n' || raw[i] == '\t' || raw[i] == '\r') {
		i++
	}
	if i >= len(raw) || raw[i] != '"' {
		return "", "", 0, false
	}
	var out []byte
	n := 0
	for j := i + 1; j < len(raw); {
		c := raw[j]
		var piece []byte
		switch {
		case c == '"':
			return name, string(out), n, true
		case c == '\\':
			if j+1 >= len(raw) {
				return "", "", 0, false
			}
			switch raw[j+1] {
			case '"', '\\', '/':
				piece = raw[j+1 : j+2]
			case 'b':
				piece = []byte{'\b'}
			case 'f':
				piece = []byte{'\f'}
			case 'n':
				piece = []byte{'\n'}
			case 'r':
				piece = []byte{'\r'}
			case 't':
				piece = []byte{'\t'}
			case 'u':
				if j+6 > len(raw) {
					return "", "", 0, false
				}
				r1, err := strconv.ParseUint(string(raw[j+2:j+6]), 16, 32)
				if err != nil {
					return "", "", 0, false
				}
				r := rune(r1)
				width := 6
				if utf16.IsSurrogate(r) && j+12 <= len(raw) && raw[j+6] == '\\' && raw[j+7] == 'u' {
					if r2, err := strconv.ParseUint(string(raw[j+8:j+12]), 16, 32); err == nil {
						r = utf16.DecodeRune(r, rune(r2))
						width = 12
					}
				}
				piece = utf8.AppendRune(nil, r)
				j += width
				n += len(piece)
				if len(out)+len(piece) <= max {
					out = append(out, piece...)
				}
				continue
			default:
				return "", "", 0, false
			}
			j += 2
		default:
			piece = raw[j : j+1]
			j++
		}
		n += len(piece)
		if len(out)+len(piece) <= max {
			out = append(out, piece...)
		}
	}
	return "", "", 0, false
}

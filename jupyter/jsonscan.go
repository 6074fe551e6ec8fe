package jupyter

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// Every message that passes through kernelgate has its header and parent
// header parsed for routing, and every status message its
// execution_state. Kernels write these as small flat objects of plain
// strings, which scanStrings reads several times faster than
// encoding/json. Anything else (an escape in a string, a number, a nested
// value, a key that differs from a wanted one only in case, a member of
// the wrong type) makes it give up, and the caller decodes with
// encoding/json, so the result is always what encoding/json gives.

// decodeFlat decodes b into *v: with scanStrings into dst (fields of *v,
// named keys) when it can, else with encoding/json into a zeroed *v.
func decodeFlat[T any](b []byte, v *T, keys []string, dst []*string) error {
	if scanStrings(b, keys, dst) {
		return nil
	}
	var zero T
	*v = zero
	return json.Unmarshal(b, v)
}

// scanStrings reads b, a JSON object, into the string fields dst[i] for
// the members named keys[i]. A null member leaves its field unchanged, as
// encoding/json does. It reports false, with dst possibly partly written,
// when b is not an object of plain strings, nulls and booleans.
func scanStrings(b []byte, keys []string, dst []*string) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		key, j, ok := plainString(b, i)
		if !ok {
			return false
		}
		i = skipSpace(b, j)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipSpace(b, i+1)
		want := -1
		for k, name := range keys {
			if string(key) == name {
				want = k
				break
			}
			if strings.EqualFold(string(key), name) {
				return false // encoding/json matches keys regardless of case
			}
		}
		switch {
		case i >= len(b):
			return false
		case b[i] == '"':
			val, j, ok := plainString(b, i)
			if !ok {
				return false
			}
			if want >= 0 {
				*dst[want] = string(val)
			}
			i = j
		case hasWord(b, i, "null"):
			i += 4
		case want < 0 && hasWord(b, i, "true"):
			i += 4
		case want < 0 && hasWord(b, i, "false"):
			i += 5
		default:
			return false
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return skipSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// plainString reads the string starting at b[i] ('"'), returning its
// contents and the index after its closing quote; ok is false for a
// string with an escape, a control character or invalid UTF-8.
func plainString(b []byte, i int) (s []byte, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	ascii := true
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			s = b[i+1 : j]
			if !ascii && !utf8.Valid(s) {
				return nil, 0, false
			}
			return s, j + 1, true
		case c == '\\' || c < 0x20:
			return nil, 0, false
		case c >= 0x80:
			ascii = false
		}
	}
	return nil, 0, false
}

// hasWord reports whether the literal w starts at b[i] and is not
// followed by more of a word.
func hasWord(b []byte, i int, w string) bool {
	if len(b)-i < len(w) || string(b[i:i+len(w)]) != w {
		return false
	}
	j := i + len(w)
	return j == len(b) || !(b[j] >= 'a' && b[j] <= 'z' || b[j] >= 'A' && b[j] <= 'Z' || b[j] >= '0' && b[j] <= '9')
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

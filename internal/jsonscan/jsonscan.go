// Package jsonscan reads and checks JSON without reflection and without
// allocating, for the few shapes that every message through kernelgate
// has: a message's header and parent header (small flat objects of plain
// strings), and the envelope of the websocket's JSON framing (an object
// whose members are passed on as they are). It also writes JSON strings
// (AppendString), for output of megabytes written in one allocation.
//
// Each function either gives exactly what encoding/json gives for its
// input or reports that it gave up, and the caller then uses
// encoding/json. The tests compare them with encoding/json on fuzzed
// input.
package jsonscan

import (
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth is encoding/json's limit on nested arrays and objects.
const maxDepth = 10000

// Valid reports whether b is one JSON value with optional surrounding
// whitespace, as json.Valid does.
func Valid(b []byte) bool {
	i, ok := Skip(b, SkipSpace(b, 0))
	return ok && SkipSpace(b, i) == len(b)
}

// Skip checks the JSON value that starts at b[i] and returns the index
// just after it; ok is false when there is no valid value there.
func Skip(b []byte, i int) (next int, ok bool) {
	var stackBuf [64]byte
	stack := stackBuf[:0] // '{' or '[' for each open container
	for {
		// A value starts at b[i].
		if i >= len(b) {
			return 0, false
		}
		switch c := b[i]; {
		case c == '{' || c == '[':
			if len(stack) >= maxDepth {
				return 0, false
			}
			end := byte('}')
			if c == '[' {
				end = ']'
			}
			i = SkipSpace(b, i+1)
			if i < len(b) && b[i] == end {
				i++
				break // an empty container is a whole value
			}
			stack = append(stack, c)
			if c == '{' {
				if i, ok = skipKey(b, i); !ok {
					return 0, false
				}
			}
			continue // to its first value
		case c == '"':
			if i, ok = skipString(b, i); !ok {
				return 0, false
			}
		case c == 't':
			if !hasLiteral(b, i, "true") {
				return 0, false
			}
			i += 4
		case c == 'f':
			if !hasLiteral(b, i, "false") {
				return 0, false
			}
			i += 5
		case c == 'n':
			if !hasLiteral(b, i, "null") {
				return 0, false
			}
			i += 4
		default:
			if i, ok = skipNumber(b, i); !ok {
				return 0, false
			}
		}
		// A value ended at b[i]: close containers until one goes on.
		for {
			if len(stack) == 0 {
				return i, true
			}
			i = SkipSpace(b, i)
			if i >= len(b) {
				return 0, false
			}
			top := stack[len(stack)-1]
			if b[i] == ',' {
				i = SkipSpace(b, i+1)
				if top == '{' {
					if i, ok = skipKey(b, i); !ok {
						return 0, false
					}
				}
				break
			}
			if top == '{' && b[i] == '}' || top == '[' && b[i] == ']' {
				stack = stack[:len(stack)-1]
				i++
				continue
			}
			return 0, false
		}
	}
}

// skipKey checks a member's key and colon at b[i] and returns the index
// of its value.
func skipKey(b []byte, i int) (int, bool) {
	i, ok := skipString(b, i)
	if !ok {
		return 0, false
	}
	i = SkipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return 0, false
	}
	return SkipSpace(b, i+1), true
}

// skipString checks the string at b[i] and returns the index after its
// closing quote. Like encoding/json it takes any byte from 0x20 up,
// valid UTF-8 or not.
func skipString(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, false
	}
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c < 0x20:
			return 0, false
		case c == '\\':
			i++
			if i >= len(b) {
				return 0, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(b)-i <= 4 {
					return 0, false
				}
				for _, h := range b[i+1 : i+5] {
					if !isHex(h) {
						return 0, false
					}
				}
				i += 4
			default:
				return 0, false
			}
		}
	}
	return 0, false
}

// skipNumber checks the number at b[i]: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func skipNumber(b []byte, i int) (int, bool) {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return 0, false
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		i = skipDigits(b, i+1)
	default:
		return 0, false
	}
	if i < len(b) && b[i] == '.' {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return 0, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return 0, false
		}
		i = j
	}
	return i, true
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func hasLiteral(b []byte, i int, w string) bool {
	return len(b)-i >= len(w) && string(b[i:i+len(w)]) == w
}

// Members reads b, one JSON object, setting dst[k] to the raw value of
// its member named keys[k] (the last one when a key repeats, as
// encoding/json does; dst[k] is left alone when there is none). It
// checks the whole of b. It reports false, with dst possibly partly
// written, when b is not a valid JSON object, or when a key has an
// escape or invalid UTF-8 or equals one of keys only regardless of case
// (encoding/json would match it).
func Members(b []byte, keys []string, dst [][]byte) bool {
	return eachMember(b, keys, func(want, i int) (int, bool) {
		j, ok := Skip(b, i)
		if ok && want >= 0 {
			dst[want] = b[i:j]
		}
		return j, ok
	})
}

// Strings reads b, a JSON object, into the string fields dst[i] for the
// members named keys[i]. A null member leaves its field unchanged, as
// encoding/json does. It reports false, with dst possibly partly written,
// when b is not an object of plain strings, nulls and booleans. The
// strings it sets share one copy of b.
func Strings(b []byte, keys []string, dst []*string) bool {
	var whole string // b, copied when the first value is kept
	return eachMember(b, keys, func(want, i int) (int, bool) {
		switch {
		case b[i] == '"':
			val, j, ok := PlainString(b, i)
			if ok && want >= 0 {
				if whole == "" {
					whole = string(b)
				}
				*dst[want] = whole[i+1 : i+1+len(val)]
			}
			return j, ok
		case hasWord(b, i, "null"):
			return i + 4, true
		case want < 0 && hasWord(b, i, "true"):
			return i + 4, true
		case want < 0 && hasWord(b, i, "false"):
			return i + 5, true
		}
		return 0, false
	})
}

// eachMember walks b, one JSON object whose keys are plain strings, and
// calls value for each member with the index of its key in keys (-1 for
// none) and the index of its value, which starts at b[i]; value returns
// the index after the value, or false. eachMember reports false when b is
// not such an object, when value does, or when a key equals one of keys
// only regardless of case.
func eachMember(b []byte, keys []string, value func(want, i int) (next int, ok bool)) bool {
	return walk(b, func(key []byte, i int) (int, bool) {
		want, ok := Lookup(key, keys)
		if !ok {
			return 0, false
		}
		return value(want, i)
	})
}

// Each reads b, one JSON object whose keys are plain strings, calling fn
// with each key and raw value in order (a repeated key is passed each
// time). The slices share b's bytes, capped at their ends, so appending
// to one copies it. It checks the whole of b and reports false, with fn
// possibly called for some members, when b is not such an object; a
// caller decoding into a map then gives up to encoding/json, which
// reads escaped keys too.
func Each(b []byte, fn func(key, value []byte)) bool {
	return walk(b, func(key []byte, i int) (int, bool) {
		j, ok := Skip(b, i)
		if ok {
			fn(key[:len(key):len(key)], b[i:j:j])
		}
		return j, ok
	})
}

// walk walks b, one JSON object whose keys are plain strings, calling
// member with each key and the index of its value; member returns the
// index after the value, or false.
func walk(b []byte, member func(key []byte, i int) (next int, ok bool)) bool {
	i := SkipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = SkipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return SkipSpace(b, i+1) == len(b)
	}
	for {
		key, j, ok := PlainString(b, i)
		if !ok {
			return false
		}
		i = SkipSpace(b, j)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = SkipSpace(b, i+1)
		if i >= len(b) {
			return false
		}
		if i, ok = member(key, i); !ok {
			return false
		}
		i = SkipSpace(b, i)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = SkipSpace(b, i+1)
		case '}':
			return SkipSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// Lookup returns the index of key in keys (-1 for none); ok is false
// when key matches one of keys only regardless of case.
func Lookup(key []byte, keys []string) (int, bool) {
	for k, name := range keys {
		if string(key) == name {
			return k, true
		}
		if strings.EqualFold(string(key), name) {
			return -1, false
		}
	}
	return -1, true
}

// PlainString reads the string starting at b[i] ('"'), returning its
// contents and the index after its closing quote; ok is false for a
// string with an escape, a control character or invalid UTF-8.
func PlainString(b []byte, i int) (s []byte, next int, ok bool) {
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
	if !hasLiteral(b, i, w) {
		return false
	}
	j := i + len(w)
	return j == len(b) || !(b[j] >= 'a' && b[j] <= 'z' || b[j] >= 'A' && b[j] <= 'Z' || b[j] >= '0' && b[j] <= '9')
}

// SkipSpace returns the index of the first byte from b[i] on that is not
// JSON whitespace.
func SkipSpace(b []byte, i int) int {
	for i < len(b) && IsSpace(b[i]) {
		i++
	}
	return i
}

// IsSpace reports whether c is JSON whitespace.
func IsSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// String reads b, one JSON string with nothing around it, as
// encoding/json decodes it. It reports false for a string it leaves to
// encoding/json: one with invalid UTF-8 or a \u escape of a surrogate
// (replaced or paired there), or one that is not valid.
func String(b []byte) (string, bool) {
	s, next, ok := PlainString(b, 0)
	if ok {
		return string(s), next == len(b)
	}
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return "", false
	}
	out := make([]byte, 0, len(b)-2)
	for i := 1; i < len(b)-1; i++ {
		c := b[i]
		switch {
		case c < 0x20 || c == '"':
			return "", false
		case c != '\\':
			out = append(out, c)
			continue
		}
		if i++; i >= len(b)-1 {
			return "", false
		}
		switch b[i] {
		case '"', '\\', '/':
			out = append(out, b[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			if i+4 > len(b)-2 { // the four digits, before the closing quote
				return "", false
			}
			r := rune(0)
			for _, h := range b[i+1 : i+5] {
				switch {
				case h >= '0' && h <= '9':
					r = r<<4 | rune(h-'0')
				case h >= 'a' && h <= 'f':
					r = r<<4 | rune(h-'a'+10)
				case h >= 'A' && h <= 'F':
					r = r<<4 | rune(h-'A'+10)
				default:
					return "", false
				}
			}
			if utf16.IsSurrogate(r) {
				return "", false
			}
			out = utf8.AppendRune(out, r)
			i += 4
		default:
			return "", false
		}
	}
	if !utf8.Valid(out) {
		return "", false
	}
	return string(out), true
}

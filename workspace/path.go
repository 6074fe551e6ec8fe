package workspace

import (
	"strings"
	"unicode/utf8"
)

// Paths as callers write them and as listings show them.
//
// A name on disk is any bytes but "/" and NUL; an API path is a JSON
// string, which holds UTF-8 only. So that every listed entry can be named
// back, a byte that is not part of valid UTF-8 is written \xHH (two hex
// digits), and so is a backslash itself (\x5c): the file bad<0xff>.txt is
// listed as `bad\xff.txt` and reached by that path, the file a\b as
// `a\x5cb`. Every other character stands for itself. A path given to this
// package may use \xHH for any byte but "/" and NUL; a backslash not
// followed by x and two hex digits is a bad path (no Windows separators).

// MaxDepth bounds the number of elements of a path: a deeper path is
// ErrBadPath, and a recursive listing does not go below it.
const MaxDepth = 128

// maxName and maxPath are Linux's NAME_MAX and PATH_MAX.
const (
	maxName = 255
	maxPath = 4096
)

// CleanPath checks a caller's path and returns it in canonical form: "/"-
// separated, relative, without empty, "." or ".." elements, with its \xHH
// escapes turned into the bytes they stand for (the path on disk); "" and
// "." are the workspace itself ("."). A single trailing "/" is allowed.
func CleanPath(p string) (string, error) {
	if p == "" || p == "." || p == "./" {
		return ".", nil
	}
	if strings.HasPrefix(p, "/") {
		return "", errorf(ErrBadPath, "%q is absolute: paths are relative to the workspace", p)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errorf(ErrBadPath, "%q holds a NUL", p)
	}
	p = strings.TrimSuffix(p, "/")
	if len(p) > 4*maxPath { // an escape is 4 bytes for 1: longer is too long whatever it holds
		return "", errorf(ErrBadPath, "the path is longer than %d bytes", maxPath)
	}
	if n := strings.Count(p, "/") + 1; n > MaxDepth {
		return "", errorf(ErrBadPath, "the path has %d levels, over the %d allowed", n, MaxDepth)
	}
	if !strings.Contains(p, `\`) {
		return p, checkElements(p, p)
	}
	raw, err := unescape(p)
	if err != nil {
		return "", err
	}
	return raw, checkElements(raw, p)
}

// checkElements checks the elements of raw, the path on disk that the
// caller wrote as p.
func checkElements(raw, p string) error {
	if len(raw) > maxPath {
		return errorf(ErrBadPath, "the path is longer than %d bytes", maxPath)
	}
	for el := range strings.SplitSeq(raw, "/") {
		switch el {
		case "", ".", "..":
			return errorf(ErrBadPath, "%q has an empty, . or .. element: paths stay inside the workspace", p)
		}
		if len(el) > maxName {
			return errorf(ErrBadPath, "a name is longer than %d bytes", maxName)
		}
	}
	return nil
}

// unescape turns the \xHH escapes of p into bytes; an escaped "/" or NUL
// would make one element two, or end the path: refused.
func unescape(p string) (string, error) {
	var b strings.Builder
	b.Grow(len(p))
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		if i+3 >= len(p) || p[i+1] != 'x' {
			return "", errorf(ErrBadPath, `%q: a backslash starts an escape \xHH of one byte`, p)
		}
		hi, ok1 := unhex(p[i+2])
		lo, ok2 := unhex(p[i+3])
		if !ok1 || !ok2 {
			return "", errorf(ErrBadPath, `%q: a backslash starts an escape \xHH of one byte`, p)
		}
		v := hi<<4 | lo
		if v == '/' || v == 0 {
			return "", errorf(ErrBadPath, `%q: \x2f and \x00 are not allowed in a name`, p)
		}
		b.WriteByte(v)
		i += 3
	}
	return b.String(), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// escape is the API form of raw, a path on disk: bytes that are not valid
// UTF-8, and backslashes, as \xHH.
func escape(raw string) string {
	if utf8.ValidString(raw) && !strings.Contains(raw, `\`) {
		return raw
	}
	const hex = "0123456789abcdef"
	var b strings.Builder
	b.Grow(len(raw) + 8)
	for i := 0; i < len(raw); {
		r, size := utf8.DecodeRuneInString(raw[i:])
		if (r == utf8.RuneError && size == 1) || r == '\\' {
			c := raw[i]
			b.WriteString(`\x`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		} else {
			b.WriteString(raw[i : i+size])
		}
		i += size
	}
	return b.String()
}

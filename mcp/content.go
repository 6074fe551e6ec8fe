package mcp

import (
	"encoding/base64"
	"fmt"
	"io"
	"mime"
	"path"
	"strings"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// imageTypes are the file types read_file returns as images.
var imageTypes = map[string]bool{"image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true}

// fileType is the media type of the file p, from its name.
func fileType(p string) string {
	typ := mime.TypeByExtension(path.Ext(p))
	if i := strings.IndexByte(typ, ';'); i >= 0 {
		typ = typ[:i]
	}
	return typ
}

// answerBound reads the size bytes of the file p from r and returns at
// least the length of the content readContent makes of them (the JSON
// string of the text, or the base64): what a read_file call takes from
// the budget. Images are not read.
func answerBound(r io.Reader, p string, size int64) (int64, error) {
	b64 := int64(base64.StdEncoding.EncodedLen(int(size)))
	if imageTypes[fileType(p)] {
		return b64, nil
	}
	var c jsonCounter
	if _, err := io.Copy(&c, io.LimitReader(r, size)); err != nil {
		return 0, fmt.Errorf("reading %s: %w", p, err)
	}
	return max(c.n, b64), nil
}

// jsonCounter counts what the bytes written to it take as a JSON string:
// ASCII as jsonASCII says, U+2028 and U+2029 six bytes each (\u2028),
// every other byte one. Bytes of invalid UTF-8 count one (such data goes
// as base64).
type jsonCounter struct {
	n    int64
	last [2]byte // the two bytes before the next one
}

func (c *jsonCounter) Write(p []byte) (int, error) {
	for _, b := range p {
		switch {
		case b < utf8.RuneSelf:
			c.n += int64(jsonASCII[b])
		case (b == 0xA8 || b == 0xA9) && c.last == [2]byte{0xE2, 0x80}:
			c.n += 4 // with the two before it, counted one each: six
		default:
			c.n++
		}
		c.last = [2]byte{c.last[1], b}
	}
	return len(p), nil
}

// jsonASCII is what each ASCII byte takes in a JSON string of
// encoding/json, which escapes <, > and & too (the SDK marshals text
// content with it).
var jsonASCII = func() (t [utf8.RuneSelf]uint8) {
	for b := range t {
		switch {
		case b == '"' || b == '\\' || b == '\n' || b == '\r' || b == '\t' || b == '\b' || b == '\f':
			t[b] = 2
		case b < 0x20 || b == '<' || b == '>' || b == '&':
			t[b] = 6
		default:
			t[b] = 1
		}
	}
	return t
}()

// jsonStringLen is the length of valid UTF-8 s as a JSON string of
// encoding/json, without its quotes.
func jsonStringLen(s string) int64 {
	var n int64
	for i := 0; i < len(s); i++ {
		b := s[i]
		switch {
		case b < utf8.RuneSelf:
			n += int64(jsonASCII[b])
		case b == 0xE2 && i+2 < len(s) && s[i+1] == 0x80 && (s[i+2] == 0xA8 || s[i+2] == 0xA9):
			n += 6 // \u2028, \u2029
			i += 2
		default:
			n++
		}
	}
	return n
}

// readContent reads the size bytes of the file p from r (fewer if it
// shrank; the bytes it had when opened if it grew) and makes read_file's
// answer of them: an image for the image types models read, text when it
// is UTF-8 without NUL, base64 otherwise. Text longer than bound as JSON
// (the file changed since answerBound read it) goes as base64 too, which
// is within bound. The bytes are read once into what the answer holds,
// without a copy of the whole file beside it.
func readContent(r io.Reader, p string, size, bound int64) (sdk.Content, map[string]any, error) {
	if typ := fileType(p); imageTypes[typ] {
		// The SDK encodes the image's bytes as base64 itself.
		data := make([]byte, size)
		n, err := io.ReadFull(r, data)
		if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
			return nil, nil, fmt.Errorf("reading %s: %w", p, err)
		}
		return &sdk.ImageContent{Data: data[:n], MIMEType: typ}, map[string]any{"path": p, "size": n, "mimeType": typ}, nil
	}
	var b strings.Builder
	b.Grow(int(size))
	if _, err := io.Copy(&b, io.LimitReader(r, size)); err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", p, err)
	}
	s := b.String()
	meta := map[string]any{"path": p, "size": len(s)}
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 && jsonStringLen(s) <= bound {
		meta["encoding"] = "utf-8"
		return &sdk.TextContent{Text: s}, meta, nil
	}
	meta["encoding"] = "base64"
	return &sdk.TextContent{Text: base64String(s)}, meta, nil
}

// base64String is s in standard base64, encoded in pieces so that no
// []byte copy of s is made.
func base64String(s string) string {
	var b strings.Builder
	b.Grow(base64.StdEncoding.EncodedLen(len(s)))
	enc := base64.NewEncoder(base64.StdEncoding, &b)
	var chunk [48 << 10]byte // a multiple of 3: no padding inside
	for len(s) > 0 {
		n := copy(chunk[:], s)
		enc.Write(chunk[:n])
		s = s[n:]
	}
	enc.Close()
	return b.String()
}

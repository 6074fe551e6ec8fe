package jupyter

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"regexp"
	"unicode/utf8"

	"kernelgate/internal/jsonscan"
)

// An output message larger than Config.KeepOutput (a print of hundreds of
// megabytes, a huge repr) is not read whole: its frames are read as they
// arrive, their signature is computed as the bytes pass, and only the
// head and the tail of the content are kept, with a marker between them
// saying how many bytes were dropped. The kernel and its state are kept.

// TruncationMarker is the text that stands where output was dropped.
func TruncationMarker(dropped int64) string {
	return fmt.Sprintf("\n[kernelgate] output truncated: %d bytes dropped\n", dropped)
}

// cutInfo is what readCut made of an oversized output message.
type cutInfo struct {
	frames  [][]byte
	dropped int64
	// err is why the message is not to be used (a bad signature); the
	// connection is fine.
	err error
}

// cutScratch is the buffer the dropped middle of a frame passes through.
const cutScratch = 256 << 10

// minCutContent is the least content budget worth a head and a tail.
const minCutContent = 4 << 10

// cuttable returns the type of the message whose frames so far are frames
// when it is output that can be cut from the next frame on: its header,
// parent header and metadata were read, and the next frame is its content
// or a buffer. "" otherwise; decided says whether the answer holds for the
// rest of the message (its header was read).
func cuttable(frames [][]byte) (t MsgType, decided bool) {
	d := delimiterIndex(frames)
	if d < 0 || len(frames) < d+5 {
		return "", false
	}
	var h Header
	if decodeFlat(frames[d+2], &h, headerKeys, []*string{&h.MsgID, &h.Session, &h.Username, &h.Date, (*string)(&h.MsgType), &h.Version}) != nil {
		return "", true
	}
	switch h.MsgType {
	case StreamMsg, DisplayData, UpdateDisplayData, ExecuteResult:
		return h.MsgType, true
	}
	return "", true
}

func delimiterIndex(frames [][]byte) int {
	for i, f := range frames {
		if bytes.Equal(f, delimiter) {
			return i
		}
	}
	return -1
}

// readCut reads the rest of an output message of type typ whose frames so
// far are frames, from the frame whose header (flag, size) was just read:
// the content is cut to its head and tail within the limit (cutContent),
// buffers that do not fit are dropped (an empty frame stays in their
// place while the frame count allows), and the signature is checked over
// the bytes as they pass.
func (s *socket) readCut(frames [][]byte, typ MsgType, flag byte, size uint64) (*cutInfo, error) {
	d := delimiterIndex(frames)
	c := &cutInfo{}
	var h hash.Hash
	if s.lim.signer != nil {
		h = s.lim.signer.hasher()
	}
	if h != nil {
		for _, p := range frames[d+2 : min(d+6, len(frames))] {
			h.Write(p)
		}
	}
	keep := s.lim.keepOf(typ)
	var kept uint64
	for _, f := range frames {
		kept += uint64(len(f))
	}
	var scratch []byte
	for {
		switch {
		case len(frames) == d+5: // the content
			budget := keep - min(kept, keep)
			content, dropped, err := s.cutContent(size, budget, typ, h)
			if err != nil {
				return c, err
			}
			frames = append(frames, content)
			kept += uint64(len(content))
			c.dropped += dropped
		case size <= keep && kept <= keep-size && len(frames) < s.lim.frames: // a buffer that fits
			body := make([]byte, size)
			if _, err := io.ReadFull(s.conn, body); err != nil {
				return c, err
			}
			frames = append(frames, body)
			kept += size
		default: // a buffer that does not
			if uint64(len(scratch)) < min(size, cutScratch) {
				scratch = make([]byte, min(size, cutScratch))
			}
			if err := s.discard(size, scratch, nil); err != nil {
				return c, err
			}
			if len(frames) < s.lim.frames {
				frames = append(frames, []byte{})
			}
			c.dropped += int64(size)
		}
		if flag&flagMore == 0 {
			break
		}
		var err error
		if flag, size, err = s.readFrameHeader(); err != nil {
			return c, err
		}
		if flag&flagCommand != 0 {
			return c, fmt.Errorf("%w: a command frame inside a message", ErrMalformed)
		}
	}
	c.frames = frames
	if h != nil && len(frames) > d+5 {
		c.err = s.lim.signer.check(frames[d+1], h.Sum(nil))
	}
	return c, nil
}

// discard reads n bytes through buf, handing each piece to fn when set.
func (s *socket) discard(n uint64, buf []byte, fn func([]byte)) error {
	for n > 0 {
		b := buf[:min(n, uint64(len(buf)))]
		if _, err := io.ReadFull(s.conn, b); err != nil {
			return err
		}
		if fn != nil {
			fn(b)
		}
		n -= uint64(len(b))
	}
	return nil
}

// cutContent reads a content frame of size bytes, keeping at most budget
// of it: its head and its tail with the marker between them when the
// bytes dropped lie inside one text string (a stream's text, a text/…
// entry of a bundle), or else a content holding only the marker. Every
// byte is hashed into h (when set). It returns the content kept and how
// many bytes were dropped: of the text when a head and a tail are kept.
func (s *socket) cutContent(size, budget uint64, typ MsgType, h hash.Hash) ([]byte, int64, error) {
	write := func(b []byte) {
		if h != nil {
			h.Write(b)
		}
	}
	budget = max(budget, minCutContent)
	if size <= budget {
		body := make([]byte, size)
		if _, err := io.ReadFull(s.conn, body); err != nil {
			return nil, 0, err
		}
		write(body)
		return body, 0, nil
	}
	head := budget / 2
	tail := budget - head
	out := make([]byte, head+markerRoom+tail)
	var lx jsonLexer
	if _, err := io.ReadFull(s.conn, out[:head]); err != nil {
		return nil, 0, err
	}
	write(out[:head])
	lx.scan(out[:head])
	atHead := lx
	scratch := make([]byte, min(size-head-tail, cutScratch))
	err := s.discard(size-head-tail, scratch, func(b []byte) {
		write(b)
		if lx.strings == atHead.strings {
			lx.scan(b) // only while the head's string may still go on
		}
	})
	if err != nil {
		return nil, 0, err
	}
	atTail := lx
	t := out[uint64(len(out))-tail:]
	if _, err := io.ReadFull(s.conn, t); err != nil {
		return nil, 0, err
	}
	write(t)
	if atHead.inStr && atTail.inStr && atHead.strings == atTail.strings && textKey(out[:atHead.strAt], typ) {
		cut := int64(head)
		if atHead.back || atHead.hex > 0 {
			cut = atHead.escAt
		}
		cut = int64(utf8Start(out[:cut], int(atHead.strAt)+1))
		skip := 0
		switch {
		case atTail.back && len(t) > 0 && t[0] == 'u':
			skip = 5
		case atTail.back:
			skip = 1
		case atTail.hex > 0:
			skip = atTail.hex
		}
		for skip < len(t) && !utf8.RuneStart(t[skip]) {
			skip++
		}
		skip = min(skip, len(t))
		// The marker counts the text dropped, not its JSON escapes.
		dropped := int64(size) - cut - int64(len(t)-skip) - (atTail.extra - atHead.extra)
		marker, _ := json.Marshal(TruncationMarker(dropped))
		marker = marker[1 : len(marker)-1] // inside the string
		n := copy(out[cut:], marker)
		n += copy(out[int(cut)+n:], t[skip:])
		kept := out[:int(cut)+n]
		if jsonscan.Valid(kept) {
			return kept, dropped, nil
		}
	}
	return markerContent(typ, out[:head], t, int64(size)), int64(size), nil
}

// markerRoom is room enough for the marker inside a JSON string.
const markerRoom = 128

// textKey reports whether the string that begins after prefix is the
// value of a member whose text may be cut: a stream's "text", a text/…
// entry of a bundle.
func textKey(prefix []byte, typ MsgType) bool {
	p := bytes.TrimRight(prefix, " \t\r\n")
	p, ok := bytes.CutSuffix(p, []byte(":"))
	if !ok {
		return false
	}
	p, ok = bytes.CutSuffix(bytes.TrimRight(p, " \t\r\n"), []byte(`"`))
	if !ok {
		return false
	}
	key := p[bytes.LastIndexByte(p, '"')+1:]
	if typ == StreamMsg {
		return string(key) == "text"
	}
	return bytes.HasPrefix(key, []byte("text/"))
}

// utf8Start moves the end of b back to the start of an incomplete UTF-8
// sequence, never before low.
func utf8Start(b []byte, low int) int {
	end := len(b)
	for i := end - 1; i >= max(low, end-utf8.UTFMax); i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:end]) {
				return i
			}
			break
		}
	}
	return end
}

var (
	streamName     = regexp.MustCompile(`"name"\s*:\s*"(stdout|stderr)"`)
	executionCount = regexp.MustCompile(`"execution_count"\s*:\s*(\d+)`)
)

// markerContent is the content of an output message of type typ that
// keeps nothing but the marker: what was kept of its head and tail tells
// its stream name or execution count.
func markerContent(typ MsgType, head, tail []byte, dropped int64) []byte {
	text := TruncationMarker(dropped)
	var v any
	switch typ {
	case StreamMsg:
		name := "stdout"
		if m := streamName.FindSubmatch(head); m != nil {
			name = string(m[1])
		}
		v = map[string]string{"name": name, "text": text}
	default:
		c := map[string]any{"data": map[string]string{"text/plain": text}, "metadata": map[string]any{}, "transient": map[string]any{}}
		if typ == ExecuteResult {
			var n json.RawMessage = []byte("null")
			if m := executionCount.FindSubmatch(tail); m != nil {
				n = m[1]
			} else if m := executionCount.FindSubmatch(head); m != nil {
				n = m[1]
			}
			c["execution_count"] = n
		}
		v = c
	}
	b, _ := json.Marshal(v)
	return b
}

// jsonLexer follows the strings of a JSON text as its bytes pass, enough
// to know where a string begins and whether one ended.
type jsonLexer struct {
	off     int64 // bytes scanned
	inStr   bool
	back    bool  // just after a backslash in a string
	hex     int   // hex digits of a \u escape still to come
	escAt   int64 // where the escape in progress began
	strAt   int64 // where the current (or last) string began: its quote
	strings int64 // strings ended so far
	// extra is how many more bytes the escapes seen so far take than the
	// text they stand for; code is the \u escape being read.
	extra int64
	code  rune
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10
	}
	return 0
}

func (l *jsonLexer) scan(b []byte) {
	q := -1 // index of the next quote at or after i, len(b) when none
	for i := 0; i < len(b); {
		switch {
		case l.back:
			l.back = false
			if b[i] == 'u' {
				l.hex, l.code = 4, 0
			} else {
				l.extra++ // two bytes for one
			}
			i++
		case l.hex > 0:
			l.code = l.code<<4 | rune(unhex(b[i]))
			if l.hex--; l.hex == 0 {
				n := utf8.RuneLen(l.code)
				if n < 0 { // half of a surrogate pair: two of four bytes
					n = 2
				}
				l.extra += int64(6 - n)
			}
			i++
		case l.inStr:
			if q < i {
				if q = bytes.IndexByte(b[i:], '"'); q < 0 {
					q = len(b)
				} else {
					q += i
				}
			}
			if bs := bytes.IndexByte(b[i:q], '\\'); bs >= 0 {
				i += bs
				l.back, l.escAt = true, l.off+int64(i)
				i++
				continue
			}
			if q == len(b) {
				i = len(b)
				continue
			}
			i = q + 1
			l.inStr = false
			l.strings++
		default:
			j := bytes.IndexByte(b[i:], '"')
			if j < 0 {
				i = len(b)
				continue
			}
			i += j
			l.inStr, l.strAt = true, l.off+int64(i)
			i++
		}
	}
	l.off += int64(len(b))
}

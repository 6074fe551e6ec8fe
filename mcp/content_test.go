package mcp

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// jsonStringLen says how long encoding/json makes a string, which the
// SDK's text content is marshalled with.
func TestJSONStringLen(t *testing.T) {
	var every strings.Builder
	for c := rune(1); c < 0x80; c++ {
		every.WriteRune(c)
	}
	for _, s := range []string{"", "plain text", every.String(), "<a href=\"x\">&amp;</a>", "line\u2028sep\u2029para", "é ü 漢字 🎉", "\xe2\x80\x9ccurly\xe2\x80\x9d"} {
		js, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := jsonStringLen(s), int64(len(js)-2); got != want {
			t.Errorf("jsonStringLen(%q) = %d, encoding/json makes %d", s, got, want)
		}
	}
}

// read_file's answer of a file: images as images, text as text, binary
// data as base64, its length within answerBound's; a file that shrank or
// grew since it was opened gives what it has, at most the size it was
// opened with.
func TestReadContent(t *testing.T) {
	control := strings.Repeat("\x01\x02\x03", 100)
	for _, c := range []struct {
		name, path, data string
		size             int64
		kind, encoding   string
		want             string
	}{
		{"text", "a.csv", "a,b\n1,2\n", 8, "text", "utf-8", "a,b\n1,2\n"},
		{"html", "page.html", "<p class=\"x\">a &amp; b</p>", 26, "text", "utf-8", "<p class=\"x\">a &amp; b</p>"},
		{"dense markup", "tags.xml", "<a><b/></a>", 11, "text", "utf-8", "<a><b/></a>"},
		{"control characters", "log.txt", control, int64(len(control)), "text", "utf-8", control},
		{"line separators", "seps.txt", "a\u2028b\u2029", 8, "text", "utf-8", "a\u2028b\u2029"},
		{"binary", "blob.bin", "\x00\x01\x02\xff", 4, "text", "base64", "AAEC/w=="},
		{"not UTF-8", "latin1.txt", "caf\xe9", 4, "text", "base64", base64.StdEncoding.EncodeToString([]byte("caf\xe9"))},
		{"image", "plot.png", "\x89PNG\r\n", 6, "image", "", "\x89PNG\r\n"},
		{"grew", "grew.txt", "first part, then more", 10, "text", "utf-8", "first part"},
		{"shrank", "shrank.txt", "short", 100, "text", "utf-8", "short"},
		{"image that shrank", "small.png", "\x89PN", 6, "image", "", "\x89PN"},
	} {
		t.Run(c.name, func(t *testing.T) {
			bound, err := answerBound(strings.NewReader(c.data), c.path, c.size)
			if err != nil {
				t.Fatal(err)
			}
			content, meta, err := readContent(strings.NewReader(c.data), c.path, c.size, bound)
			if err != nil {
				t.Fatal(err)
			}
			var got string
			switch x := content.(type) {
			case *sdk.TextContent:
				got = x.Text
				if c.kind != "text" || meta["encoding"] != c.encoding {
					t.Errorf("text content, meta %v; want %s, encoding %q", meta, c.kind, c.encoding)
				}
			case *sdk.ImageContent:
				got = string(x.Data)
				if c.kind != "image" || x.MIMEType != "image/png" || meta["mimeType"] != "image/png" {
					t.Errorf("image content %s, meta %v; want %s", x.MIMEType, meta, c.kind)
				}
			}
			if got != c.want {
				t.Errorf("content %q, want %q", got, c.want)
			}
			js, _ := json.Marshal(content)
			if n := int64(len(js)); n > bound+int64(len(`{"type":"image","mimeType":"image/png","data":""}`)) {
				t.Errorf("the content takes %d bytes of JSON, over its bound %d: %s", n, bound, js)
			}
			if size := meta["size"].(int); int64(size) != min(c.size, int64(len(c.data))) {
				t.Errorf("size %d, want %d", size, min(c.size, int64(len(c.data))))
			}
		})
	}
}

// Text that became longer as JSON than its bound after answerBound read
// the file (it changed in between) goes as base64, within the bound.
func TestReadContentChanged(t *testing.T) {
	bound, _ := answerBound(strings.NewReader("plain text"), "a.txt", 10)
	content, meta, err := readContent(strings.NewReader("<<<<<<<<<<"), "a.txt", 10, bound)
	if err != nil {
		t.Fatal(err)
	}
	text := content.(*sdk.TextContent).Text
	if meta["encoding"] != "base64" || text != base64.StdEncoding.EncodeToString([]byte("<<<<<<<<<<")) || int64(len(text)) > bound {
		t.Errorf("content %q, meta %v; want the new bytes as base64 within %d", text, meta, bound)
	}
}

func TestBase64String(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 48 << 10, 48<<10 + 1, 100<<10 + 2} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i * 7)
		}
		if got, want := base64String(string(b)), base64.StdEncoding.EncodeToString(b); got != want {
			t.Errorf("%d bytes: base64String differs from EncodeToString", n)
		}
	}
}

// For any file, the answer's content takes no more JSON than answerBound
// counted for it, and gives the file's bytes back.
func FuzzAnswerBound(f *testing.F) {
	for _, s := range []string{"", "plain", "<a>&amp;</a>", "\x01\x1f\"\\", "\u2028\u2029\xe2\x80", "caf\xe9", "\x00bin", "漢字 🎉"} {
		f.Add([]byte(s), "a.txt")
		f.Add([]byte(s), "p.png")
	}
	f.Fuzz(func(t *testing.T, data []byte, name string) {
		bound, err := answerBound(bytes.NewReader(data), name, int64(len(data)))
		if err != nil {
			t.Fatal(err)
		}
		content, meta, err := readContent(bytes.NewReader(data), name, int64(len(data)), bound)
		if err != nil {
			t.Fatal(err)
		}
		js, err := json.Marshal(content)
		if err != nil {
			t.Fatal(err)
		}
		var wire struct{ Type, Text, Data, MIMEType string }
		json.Unmarshal(js, &wire)
		overhead := len(`{"type":"image","mimeType":"","data":""}`) + len(wire.MIMEType)
		if int64(len(js)) > bound+int64(overhead) {
			t.Fatalf("%d bytes of JSON, over the bound %d: %s", len(js), bound, js)
		}
		var got []byte
		switch {
		case wire.Type == "image":
			got, _ = base64.StdEncoding.DecodeString(wire.Data)
		case meta["encoding"] == "base64":
			got, _ = base64.StdEncoding.DecodeString(wire.Text)
		default:
			got = []byte(wire.Text)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("the answer gives back %q, not %q", got, data)
		}
	})
}

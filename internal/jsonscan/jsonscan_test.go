package jsonscan

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

var validity = []string{
	`0`, `-0`, `1`, `-12.5e+3`, `1E9`, `0.0`, `"a"`, `""`, `"\u00e9\n\"\\\/\b\f\r\t"`, "\"\xff\xfe\"",
	`true`, `false`, `null`, ` {} `, `[]`, `[ ]`, `{ }`, `{"a":1}`, `{"a":[1,{"b":null}],"c":"d"}`,
	`[1,2,[3,[4,[]]],{}]`, "\t\n\r[1]\r\n", `{"":""}`, `{"a":{}}`,
	// rejected
	``, ` `, `01`, `-`, `-a`, `1.`, `.5`, `1e`, `1e+`, `+1`, `0x1`, `1.5.2`, `tru`, `truex`, `nul`, `nulll`,
	`"`, `"a`, `"\x"`, `"\u12"`, `"\u12g4"`, "\"a\x01\"", `'a'`, `[1,]`, `[,1]`, `[1 2]`, `{"a"}`, `{"a":}`,
	`{"a" 1}`, `{a:1}`, `{"a":1,}`, `{,}`, `{"a":1}}`, `[1]]`, `[`, `{`, `]`, `}`, `{"a":1 "b":2}`, `[1][2]`,
	`{} x`, `"a" "b"`, `[tru]`, `[-]`, `{"a":01}`, `[1e5x]`, "[\x00]",
}

func TestValidMatchesEncodingJSON(t *testing.T) {
	for _, s := range validity {
		if got, want := Valid([]byte(s)), json.Valid([]byte(s)); got != want {
			t.Errorf("Valid(%q) = %v, encoding/json says %v", s, got, want)
		}
	}
}

func TestValidNestingLimit(t *testing.T) {
	for _, depth := range []int{maxDepth - 1, maxDepth, maxDepth + 1} {
		for _, open := range []string{"[", `{"a":`} {
			close := "]"
			if open != "[" {
				close = "}"
			}
			b := []byte(strings.Repeat(open, depth) + "1" + strings.Repeat(close, depth))
			if got, want := Valid(b), json.Valid(b); got != want {
				t.Errorf("%d levels of %s: Valid %v, encoding/json %v", depth, open, got, want)
			}
			empty := []byte(strings.Repeat(open, depth-1) + open[:1] + strings.Repeat(close, depth))
			if open != "[" {
				empty = []byte(strings.Repeat(open, depth-1) + "{}" + strings.Repeat(close, depth-1))
			}
			if got, want := Valid(empty), json.Valid(empty); got != want {
				t.Errorf("%d levels of %s, innermost empty: Valid %v, encoding/json %v", depth, open, got, want)
			}
		}
	}
}

func TestSkipStopsAfterTheValue(t *testing.T) {
	for _, c := range []struct {
		in   string
		next int
	}{
		{`1,2`, 1}, {`"a"x`, 3}, {`[1, 2] 3`, 6}, {`{"a":{}}}`, 8}, {`null]`, 4}, {`-1.5e3}`, 6},
	} {
		if next, ok := Skip([]byte(c.in), 0); !ok || next != c.next {
			t.Errorf("Skip(%q) = %d, %v; want %d, true", c.in, next, ok, c.next)
		}
	}
}

// envelope is what the websocket's JSON framing is decoded into.
type envelope struct {
	Header  json.RawMessage `json:"header"`
	Parent  json.RawMessage `json:"parent_header"`
	Content json.RawMessage `json:"content"`
	Channel json.RawMessage `json:"channel"`
}

var envelopeKeys = []string{"header", "parent_header", "content", "channel"}

// checkMembers compares Members with encoding/json on b and reports
// whether Members took b.
func checkMembers(t *testing.T, b []byte) bool {
	t.Helper()
	var dst [4][]byte
	if !Members(b, envelopeKeys, dst[:]) {
		return false
	}
	var want envelope
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatalf("Members took %q, which encoding/json rejects: %v", b, err)
	}
	for k, w := range [][]byte{want.Header, want.Parent, want.Content, want.Channel} {
		if !bytes.Equal(dst[k], w) {
			t.Fatalf("Members read %s of %q as %q, encoding/json as %q", envelopeKeys[k], b, dst[k], w)
		}
	}
	return true
}

func TestMembersMatchesEncodingJSON(t *testing.T) {
	takes := []string{
		`{}`, ` { } `,
		`{"header":{"msg_id":"a","msg_type":"execute_request"},"parent_header":{},"metadata":{},"content":{"code":"1+1","silent":false,"n":[1,2.5,{"x":null}]},"channel":"shell","buffers":[]}`,
		`{"channel":"iopub","channel":"shell"}`,
		`{"header":null,"content":"x\ny"}`,
		`{"other":{"Header":1},"header":{}}`,
		"{\n \"header\" : { } ,\t\"content\":[]\r\n}",
		`{"header":{"a":"\u00e9"}}`,
	}
	for _, s := range takes {
		if !checkMembers(t, []byte(s)) {
			t.Errorf("Members gave up on %q", s)
		}
	}
	leaves := []string{
		`{"Header":{}}`, `{"CHANNEL":"shell"}`, `{"head\u0065r":{}}`, "{\"h\xffader\":{}}",
		`{"header":{},}`, `{"header":{}`, `{"header":{}}x`, `{"header":01}`, `[{"header":{}}]`, `{"header"}`,
		`{"content":{"a":tru}}`, ``, `null`,
	}
	for _, s := range leaves {
		if checkMembers(t, []byte(s)) {
			t.Errorf("Members took %q", s)
		}
	}
}

// checkEach compares Each with encoding/json's decoding into a map of
// raw values on b and reports whether Each took b.
func checkEach(t *testing.T, b []byte) bool {
	t.Helper()
	got := map[string]json.RawMessage{}
	if !Each(b, func(k, v []byte) { got[string(k)] = v }) {
		return false
	}
	var want map[string]json.RawMessage
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatalf("Each took %q, which encoding/json rejects: %v", b, err)
	}
	if len(got) != len(want) {
		t.Fatalf("Each read %d members of %q, encoding/json %d", len(got), b, len(want))
	}
	for k, w := range want {
		if v, ok := got[k]; !ok || !bytes.Equal(v, w) {
			t.Fatalf("Each read %q of %q as %q, encoding/json as %q", k, b, v, w)
		}
		if v := got[k]; cap(v) != len(v) {
			t.Fatalf("Each gave %q of %q with room to append over what follows", k, b)
		}
	}
	return true
}

func TestEachMatchesEncodingJSON(t *testing.T) {
	takes := []string{
		`{}`, ` { } `, `{"text/plain":"2","text/html":"<b>2</b>"}`,
		`{"text/plain":"\u001b[33m2\u001b[39m","application/json":{"a":[1,2.5,{"x":null}]}}`,
		`{"a":1,"a":2}`, `{"A":1,"a":2}`, "{\n \"image/png\" : \"iVBO\" ,\t\"x\":[]\r\n}", `{"é":true}`,
	}
	for _, s := range takes {
		if !checkEach(t, []byte(s)) {
			t.Errorf("Each gave up on %q", s)
		}
	}
	leaves := []string{
		`{"te\u0078t/plain":"2"}`, "{\"\xff\":1}", `{"a":1,}`, `{"a":1`, `{"a":1}x`, `{"a":01}`, `[]`,
		`null`, ``, `{"a"}`, `{"a":tru}`,
	}
	for _, s := range leaves {
		if checkEach(t, []byte(s)) {
			t.Errorf("Each took %q", s)
		}
	}
}

func FuzzEach(f *testing.F) {
	f.Add([]byte(`{"text/plain":"2","image/png":"iVBO","application/json":{"a":[1]}}`))
	f.Add([]byte(`{"a":1,"a":"\u0041","b":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		checkEach(t, b)
	})
}

// checkDecodeString compares String with encoding/json on b.
func checkDecodeString(t *testing.T, b []byte) bool {
	t.Helper()
	got, ok := String(b)
	if !ok {
		return false
	}
	var want string
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatalf("String took %q, which encoding/json rejects: %v", b, err)
	}
	if got != want {
		t.Fatalf("String read %q as %q, encoding/json as %q", b, got, want)
	}
	return true
}

func TestStringMatchesEncodingJSON(t *testing.T) {
	takes := []string{`""`, `"2"`, `"\u001b[33m2\u001b[39m"`, `"a\nb\t\"c\"\\\/\b\f\r"`, `"\u00e9\u20AC é"`, `"<b>&</b>"`}
	for _, s := range takes {
		if !checkDecodeString(t, []byte(s)) {
			t.Errorf("String gave up on %q", s)
		}
	}
	leaves := []string{`"\ud83d\ude00"`, `"\ud800"`, "\"\xff\"", `"a`, `"a" `, ` "a"`, `"\x"`, `"\u12"`, `"\u12g4"`, "\"\x01\"",
		`"a"b"`, `"\"`, `1`, `null`, ``}
	for _, s := range leaves {
		if checkDecodeString(t, []byte(s)) {
			t.Errorf("String took %q", s)
		}
	}
}

func FuzzString(f *testing.F) {
	f.Add([]byte(`"\u001b[33m2\u001b[39m\n"`))
	f.Add([]byte(`"plain"`))
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecodeString(t, b)
	})
}

func FuzzValid(f *testing.F) {
	for _, s := range validity {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Valid(b), json.Valid(b); got != want {
			t.Fatalf("Valid(%q) = %v, encoding/json says %v", b, got, want)
		}
	})
}

func FuzzMembers(f *testing.F) {
	f.Add([]byte(`{"header":{"msg_id":"a"},"parent_header":{},"content":{"code":"1+1"},"channel":"shell","buffers":[]}`))
	f.Add([]byte(`{"Header":{},"channel":"\u0073hell"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		checkMembers(t, b)
	})
}

func BenchmarkMembers(b *testing.B) {
	msg := []byte(`{"header":{"msg_id":"0b1f9e3c-6a2f-4f3e-9d1e-5c2a7c9d8e1f","session":"3b1f9e3c","username":"u","date":"2026-12-02T18:00:00.000000Z","msg_type":"execute_request","version":"5.3"},"parent_header":{},"metadata":{},"content":{"code":"1+1","silent":false,"store_history":true,"user_expressions":{},"allow_stdin":false,"stop_on_error":true},"channel":"shell","buffers":[]}`)
	var dst [4][]byte
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		if !Members(msg, envelopeKeys, dst[:]) {
			b.Fatal("gave up")
		}
	}
}

package jupyter

import (
	"encoding/json"
	"testing"

	"kernelgate/internal/jsonscan"
)

// The header scanner must give what encoding/json gives, or give up.
// checkScan compares the two on b for the Header fields and reports
// whether the scanner took b itself.
func checkScan(t *testing.T, b []byte) bool {
	t.Helper()
	var fast Header
	took := jsonscan.Strings(b, headerKeys, []*string{&fast.MsgID, &fast.Session, &fast.Username, &fast.Date, (*string)(&fast.MsgType), &fast.Version})
	if !took {
		return false
	}
	var want Header
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatalf("scanner took %q, which encoding/json rejects: %v", b, err)
	}
	if fast != want {
		t.Fatalf("scanner read %q as %+v, encoding/json as %+v", b, fast, want)
	}
	return true
}

func TestScanStringsMatchesEncodingJSON(t *testing.T) {
	takes := []string{
		`{}`,
		` { } `,
		`{"msg_id":"a1","msg_type":"status","session":"s","username":"u","date":"2026-12-02T10:00:00.000000Z","version":"5.3"}`,
		"{\n  \"msg_id\" : \"x\" ,\n\t\"msg_type\":\"execute_reply\"\r\n}",
		`{"msg_id":"a","subshell_id":null,"msg_type":"t"}`,
		`{"msg_id":"a","extra":true,"other":false,"msg_type":"t"}`,
		`{"msg_id":"a","msg_id":"b","msg_type":"t"}`,
		`{"msg_id":null,"msg_type":"t"}`,
		`{"msg_id":"é—ü","msg_type":"t"}`,
		`{"unknown":"x"}`,
	}
	for _, s := range takes {
		if !checkScan(t, []byte(s)) {
			t.Errorf("scanner gave up on %q", s)
		}
	}
	// Each of these it must leave to encoding/json: escapes, numbers,
	// nested values, keys that differ in case, wrong types, bad syntax,
	// invalid UTF-8, trailing data.
	leaves := []string{
		`{"msg_id":"a\"b","msg_type":"t"}`,
		`{"msg_id":"\u00e9","msg_type":"t"}`,
		`{"msg_id":"a","n":5,"msg_type":"t"}`,
		`{"msg_id":"a","o":{"x":"y"},"msg_type":"t"}`,
		`{"msg_id":"a","l":["x"],"msg_type":"t"}`,
		`{"MSG_ID":"a","msg_type":"t"}`,
		`{"Msg_Type":"t"}`,
		`{"msg_id":true}`,
		`{"msg_id":"a",}`,
		`{"msg_id":"a" "msg_type":"t"}`,
		`{"msg_id":"a"`,
		`{"msg_id":"a"}x`,
		`{"msg_id":"a"}{}`,
		"{\"msg_id\":\"a\xff\"}",
		"{\"msg_id\":\"a\x01\"}",
		`{"msg_id":nul}`,
		`{"x":nullx}`,
		`{"x":truex}`,
		`{msg_id:"a"}`,
		`["msg_id","a"]`,
		``,
		`{`,
		`{"":}`,
	}
	for _, s := range leaves {
		if checkScan(t, []byte(s)) {
			t.Errorf("scanner took %q", s)
		}
	}
}

// The headers real kernels send are what the scanner is for.
func TestScanStringsTakesKernelHeaders(t *testing.T) {
	for _, h := range []string{
		// ipykernel 6
		`{"msg_id": "6c1d8a5c-1b2e1f0f5c2e4b1a_1234_5", "msg_type": "status", "username": "root", "session": "6c1d8a5c-1b2e1f0f5c2e4b1a", "date": "2026-12-02T10:00:00.123456Z", "version": "5.3"}`,
		// Deno
		`{"msg_id":"0b9f6a3e-2f1c-4d55-9a43-0c7d1a2b3c4d","username":"kernel","session":"8e1f...","date":"2026-12-02T10:00:00.123456789+00:00","msg_type":"execute_result","version":"5.3"}`,
	} {
		if !checkScan(t, []byte(h)) {
			t.Errorf("scanner gave up on %s", h)
		}
	}
}

func FuzzScanStrings(f *testing.F) {
	for _, s := range []string{`{}`, `{"msg_id":"a","msg_type":"t","x":null,"y":true}`, `{"msg_id":"a\"b"}`, `{"MSG_ID":"a"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkScan(t, b)
		var fast parentRef
		if jsonscan.Strings(b, parentKeys, []*string{&fast.MsgID, (*string)(&fast.MsgType)}) {
			var want parentRef
			if err := json.Unmarshal(b, &want); err != nil || fast != want {
				t.Fatalf("parent %q: scanner %+v, encoding/json %+v (%v)", b, fast, want, err)
			}
		}
	})
}

func BenchmarkParseHeaders(b *testing.B) {
	m, _ := NewMessage("session-1234", StatusMsg, map[string]string{"execution_state": "idle"}, nil)
	parent, _ := NewMessage("session-1234", ExecuteRequest, nil, nil)
	raw, rawParent := m.RawHeader, parent.RawHeader
	b.ReportAllocs()
	for b.Loop() {
		x := Message{RawHeader: raw, RawParent: rawParent}
		if err := x.parseHeaders(); err != nil {
			b.Fatal(err)
		}
	}
}

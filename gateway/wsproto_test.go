package gateway

import (
	"bytes"
	"encoding/json"
	"testing"

	"kernelgate/sessions"
)

var executeJSON = []byte(`{"header":{"msg_id":"0b1f9e3c-6a2f-4f3e-9d1e-5c2a7c9d8e1f","session":"3b1f9e3c-6a2f-4f3e-9d1e-5c2a7c9d8e1f","username":"bench","date":"2026-12-02T18:00:00.000000Z","msg_type":"execute_request","version":"5.3"},"parent_header":{},"metadata":{},"content":{"code":"1+1","silent":false,"store_history":true,"user_expressions":{},"allow_stdin":false,"stop_on_error":true},"channel":"shell","buffers":[]}`)

// decodeWithEncodingJSON reads the envelope as decodeLegacyText did
// before jsonscan: the reference its fast path must agree with.
func decodeWithEncodingJSON(b []byte) (string, *sessions.Message, error) {
	var env legacyEnvelope
	if err := json.Unmarshal(b, &env); err != nil {
		return "", nil, err
	}
	return legacyMessage(env, nil)
}

// checkLegacyText compares decodeLegacyText with the reference on b.
func checkLegacyText(t *testing.T, b []byte) {
	t.Helper()
	ch, m, err := decodeLegacyText(b)
	wantCh, want, wantErr := decodeWithEncodingJSON(b)
	if (err == nil) != (wantErr == nil) {
		t.Fatalf("%q: error %v, encoding/json's %v", b, err, wantErr)
	}
	if err != nil {
		return
	}
	if ch != wantCh || m.Header != want.Header || m.ParentID != want.ParentID ||
		!bytes.Equal(m.RawHeader, want.RawHeader) || !bytes.Equal(m.RawParent, want.RawParent) ||
		!bytes.Equal(m.RawMetadata, want.RawMetadata) || !bytes.Equal(m.RawContent, want.RawContent) {
		t.Fatalf("%q: read as %s %+v, encoding/json as %s %+v", b, ch, m, wantCh, want)
	}
}

func TestDecodeLegacyTextMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{
		string(executeJSON),
		`{"header":{"msg_id":"a","msg_type":"input_reply"},"content":{"value":"x"},"channel":"stdin"}`,
		`{"header":{"msg_id":"a","msg_type":"kernel_info_request"}}`,                          // no channel: shell
		`{"header":{"msg_id":"a","msg_type":"kernel_info_request"},"channel":null}`,           // null: shell
		`{"header":{"msg_id":"a","msg_type":"kernel_info_request"},"channel":"\u0063ontrol"}`, // escaped: encoding/json
		`{"Header":{"msg_id":"a","msg_type":"kernel_info_request"},"CHANNEL":"control"}`,      // other case: encoding/json
		`{"header":{"msg_id":"a","msg_type":"t"},"channel":"iopub","channel":"shell"}`,        // the last one counts
		`{"header":{"msg_id":"a","msg_type":"t"},"channel":5}`,
		`{"header":{"msg_id":"a","msg_type":"t"},"content":[1]}`,
		`{"header":{"msg_id":"a","msg_type":"t"},"content":{"a":tru}}`,
		`{"header":{"msg_id":"a","msg_type":"t"}`,
		`{"header":{"msg_id":"a","msg_type":"t"}} x`,
		`{"header":{"msg_type":"t"}}`,
		`[]`, ``,
	} {
		checkLegacyText(t, []byte(s))
	}
}

func FuzzDecodeLegacyText(f *testing.F) {
	f.Add(executeJSON)
	f.Add([]byte(`{"Header":{"msg_id":"a","msg_type":"t"},"channel":"\u0073hell"}`))
	f.Fuzz(func(t *testing.T, b []byte) { checkLegacyText(t, b) })
}

func BenchmarkDecodeLegacyText(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := decodeLegacyText(executeJSON); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendLegacyJSON(b *testing.B) {
	_, m, err := decodeLegacyText(executeJSON)
	if err != nil {
		b.Fatal(err)
	}
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = appendLegacyJSON(buf[:0], "iopub", m, true)
	}
}

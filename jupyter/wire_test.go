package jupyter

import (
	"bytes"
	"errors"
	"testing"
)

func testSigner(t testing.TB) *Signer {
	t.Helper()
	s, err := NewSigner("hmac-sha256", []byte("secret-key"), 8)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustMessage(t testing.TB, typ MsgType, content any) *Message {
	t.Helper()
	m, err := NewMessage("session-1", typ, content, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	send, recv := testSigner(t), testSigner(t)
	parent := mustMessage(t, ExecuteRequest, map[string]string{"code": "1+1"})
	m, err := NewMessage("session-1", ExecuteResult, map[string]any{"data": map[string]string{"text/plain": "2"}}, parent)
	if err != nil {
		t.Fatal(err)
	}
	m.Identities = [][]byte{[]byte("topic")}
	m.Buffers = [][]byte{{0, 1, 2, 255}, {}}
	frames := Encode(m, send)
	got, err := Decode(frames, recv)
	if err != nil {
		t.Fatal(err)
	}
	if got.Header != m.Header {
		t.Errorf("header = %+v, want %+v", got.Header, m.Header)
	}
	if got.ParentID != parent.Header.MsgID || got.ParentType != ExecuteRequest {
		t.Errorf("parent = %q %q, want %q execute_request", got.ParentID, got.ParentType, parent.Header.MsgID)
	}
	if !bytes.Equal(got.RawContent, m.RawContent) {
		t.Errorf("content = %s, want %s", got.RawContent, m.RawContent)
	}
	if len(got.Identities) != 1 || string(got.Identities[0]) != "topic" {
		t.Errorf("identities = %q", got.Identities)
	}
	if len(got.Buffers) != 2 || !bytes.Equal(got.Buffers[0], []byte{0, 1, 2, 255}) || len(got.Buffers[1]) != 0 {
		t.Errorf("buffers = %v, want the binary buffers kept", got.Buffers)
	}
}

func TestDecodeRejectsBadSignatures(t *testing.T) {
	send := testSigner(t)
	m := mustMessage(t, StatusMsg, map[string]string{"execution_state": "idle"})
	frames := Encode(m, send)

	t.Run("replayed", func(t *testing.T) {
		recv := testSigner(t)
		if _, err := Decode(frames, recv); err != nil {
			t.Fatal(err)
		}
		if _, err := Decode(frames, recv); !errors.Is(err, ErrReplayedSignature) {
			t.Fatalf("second decode: err = %v, want ErrReplayedSignature", err)
		}
	})
	t.Run("history is bounded", func(t *testing.T) {
		recv := testSigner(t) // remembers 8
		if _, err := Decode(frames, recv); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 8; i++ {
			if _, err := Decode(Encode(mustMessage(t, StatusMsg, nil), send), recv); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := Decode(frames, recv); err != nil {
			t.Fatalf("a signature pushed out of the history is accepted again, got %v", err)
		}
	})
	tamper := func(i int, b []byte) [][]byte {
		f := make([][]byte, len(frames))
		copy(f, frames)
		f[i] = b
		return f
	}
	cases := []struct {
		name   string
		frames [][]byte
	}{
		{"wrong signature", tamper(1, bytes.Repeat([]byte("0"), 64))},
		{"signature not hex", tamper(1, bytes.Repeat([]byte("z"), 64))},
		{"short signature", tamper(1, []byte("abc"))},
		{"empty signature", tamper(1, []byte{})},
		{"content changed", tamper(5, []byte(`{"execution_state":"busy"}`))},
		{"header changed", tamper(2, bytes.Replace(frames[2], []byte("status"), []byte("stream"), 1))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := Decode(c.frames, testSigner(t)); !errors.Is(err, ErrInvalidSignature) {
				t.Fatalf("err = %v, want ErrInvalidSignature", err)
			}
		})
	}
	t.Run("other key", func(t *testing.T) {
		other, _ := NewSigner("hmac-sha256", []byte("other"), 0)
		if _, err := Decode(frames, other); !errors.Is(err, ErrInvalidSignature) {
			t.Fatalf("err = %v, want ErrInvalidSignature", err)
		}
	})
}

func TestDecodeUnsigned(t *testing.T) {
	none, err := NewSigner("hmac-sha256", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	m := mustMessage(t, StatusMsg, nil)
	frames := Encode(m, none)
	if len(frames[1]) != 0 {
		t.Fatalf("unsigned message has signature %q", frames[1])
	}
	for i := 0; i < 2; i++ { // no replay check without a key
		if _, err := Decode(frames, none); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDecodeMalformed(t *testing.T) {
	s, _ := NewSigner("", nil, 0)
	good := [][]byte{[]byte(`{"msg_id":"a","msg_type":"status"}`), []byte(`{}`), []byte(`{}`), []byte(`{}`)}
	with := func(pre [][]byte, parts ...[]byte) [][]byte {
		f := append([][]byte{}, pre...)
		return append(f, parts...)
	}
	delim := [][]byte{delimiter, {}}
	many := make([][]byte, MaxIdentities+2)
	for i := range many {
		many[i] = []byte("id")
	}
	cases := []struct {
		name   string
		frames [][]byte
	}{
		{"no frames", nil},
		{"no delimiter", good},
		{"too many identities", append(many, delim...)},
		{"nothing after delimiter", delim[:1]},
		{"missing content", with(delim, good[:3]...)},
		{"header not JSON", with(delim, []byte("nope"), good[1], good[2], good[3])},
		{"header array", with(delim, []byte("[]"), good[1], good[2], good[3])},
		{"header without msg_type", with(delim, []byte(`{"msg_id":"a"}`), good[1], good[2], good[3])},
		{"header bad field type", with(delim, []byte(`{"msg_id":1,"msg_type":"x"}`), good[1], good[2], good[3])},
		{"parent not object", with(delim, good[0], []byte(`"x"`), good[2], good[3])},
		{"parent truncated", with(delim, good[0], []byte(`{"msg_id":}`), good[2], good[3])},
		{"metadata not object", with(delim, good[0], good[1], []byte(`null`), good[3])},
		{"content empty", with(delim, good[0], good[1], good[2], []byte{})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := Decode(c.frames, s); !errors.Is(err, ErrMalformed) {
				t.Fatalf("err = %v, want ErrMalformed", err)
			}
		})
	}
}

func TestParseParts(t *testing.T) {
	m, err := ParseParts([]byte(`{"msg_id":"x","msg_type":"execute_request","session":"s"}`), nil, nil, []byte(`{"code":"1"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.RawParent) != "{}" || string(m.RawMetadata) != "{}" {
		t.Errorf("empty parts not filled in: %s %s", m.RawParent, m.RawMetadata)
	}
	if _, err := ParseParts([]byte(`{"msg_id":"x","msg_type":"t"}`), nil, nil, []byte(`{"code":`), nil); !errors.Is(err, ErrMalformed) {
		t.Errorf("invalid content: err = %v, want ErrMalformed", err)
	}
}

func TestSignerSchemes(t *testing.T) {
	for _, scheme := range []string{"hmac-sha256", "hmac-sha512", "hmac-sha1", "hmac-md5", "hmac-sha384", "hmac-sha224"} {
		s, err := NewSigner(scheme, []byte("k"), 0)
		if err != nil {
			t.Fatalf("%s: %v", scheme, err)
		}
		m := mustMessage(t, StatusMsg, nil)
		if _, err := Decode(Encode(m, s), s); err != nil {
			t.Errorf("%s: round trip: %v", scheme, err)
		}
	}
	if _, err := NewSigner("rsa-sha256", []byte("k"), 0); !errors.Is(err, ErrUnsupportedScheme) {
		t.Errorf("err = %v, want ErrUnsupportedScheme", err)
	}
}

func FuzzDecode(f *testing.F) {
	s, _ := NewSigner("hmac-sha256", []byte("k"), 0)
	m, _ := NewMessage("s", ExecuteReply, map[string]int{"execution_count": 1}, nil)
	m.Buffers = [][]byte{[]byte("buf")}
	seed := Encode(m, s)
	f.Add(bytes.Join(seed, []byte{0}), uint8(0))
	f.Add([]byte("<IDS|MSG>"), uint8(1))
	f.Add([]byte{}, uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, mode uint8) {
		frames := bytes.Split(data, []byte{0})
		signer := s
		if mode%2 == 1 {
			signer, _ = NewSigner("", nil, 0)
		}
		got, err := Decode(frames, signer)
		if err != nil {
			return
		}
		// A decoded message has what routing needs and encodes again.
		if got.Header.MsgID == "" || got.Header.MsgType == "" {
			t.Fatalf("decoded a message without msg_id or msg_type: %+v", got.Header)
		}
		again, err := Decode(Encode(got, signer), signer)
		if err != nil && !errors.Is(err, ErrReplayedSignature) {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if err == nil && again.Header != got.Header {
			t.Fatalf("header changed in a round trip")
		}
	})
}

package jupyter

import (
	"errors"
	"testing"
)

// A client's message is read as Jupyter Server reads it: only msg_id and
// msg_type must be strings; the other header members and the parent header
// may hold any JSON value, and travel to the kernel unchanged.
func TestParsePartsTakesWhatJupyterServerForwards(t *testing.T) {
	for _, c := range []struct{ header, parent string }{
		// jupyter_server's GatewayKernelClient: the date in epoch seconds.
		{`{"msg_id":"m","msg_type":"kernel_info_request","username":"u","session":"s","date":1796666662.028,"version":"5.3"}`, `{}`},
		{`{"msg_id":"m","msg_type":"kernel_info_request","username":null,"session":7,"date":null,"version":[5,3]}`, `{}`},
		{`{"msg_id":"m","msg_type":"kernel_info_request","date":{"t":1}}`, `{"msg_id":5,"msg_type":"x","date":1.5}`},
		{`{"msg_id":"m","msg_type":"kernel_info_request","date":1}`, `{"msg_id":"p","msg_type":"input_request","date":1}`},
	} {
		m, err := ParseParts([]byte(c.header), []byte(c.parent), nil, nil, nil)
		if err != nil {
			t.Errorf("%s: %v", c.header, err)
			continue
		}
		if m.Header.MsgID != "m" || m.Type() != KernelInfoRequest || string(m.RawHeader) != c.header {
			t.Errorf("%s: read as %+v, raw %s", c.header, m.Header, m.RawHeader)
		}
	}
	m, _ := ParseParts([]byte(`{"msg_id":"m","msg_type":"input_reply","date":1}`), []byte(`{"msg_id":"p","msg_type":"input_request","date":1}`), nil, nil, nil)
	if m == nil || m.ParentID != "p" || m.ParentType != InputRequest {
		t.Errorf("parent with a numeric date: %+v", m)
	}
	for _, h := range []string{
		`{"msg_id":5,"msg_type":"kernel_info_request"}`,
		`{"msg_type":"kernel_info_request","date":1}`,
		`{"msg_id":"m","msg_type":["kernel_info_request"]}`,
		`{"msg_id":"m","msg_type":"kernel_info_request","date":1`,
	} {
		if _, err := ParseParts([]byte(h), nil, nil, nil, nil); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", h, err)
		}
	}
}

func TestHeaderOf(t *testing.T) {
	for _, c := range []struct {
		header, raw, id string
		t               MsgType
	}{
		{`{"msg_id":5,"msg_type":"kernel_info_request"}`, `{"msg_id":5,"msg_type":"kernel_info_request"}`, "", KernelInfoRequest},
		{`{"msg_id":"m","msg_type":["x"]}`, `{"msg_id":"m","msg_type":["x"]}`, "m", ""},
		{`{"msg_id":"m"`, `{}`, "", ""},
		{`[1]`, `{}`, "", ""},
		{``, `{}`, "", ""},
	} {
		m := HeaderOf([]byte(c.header))
		if string(m.RawHeader) != c.raw || m.Header.MsgID != c.id || m.Type() != c.t {
			t.Errorf("HeaderOf(%s) = %s %q %q", c.header, m.RawHeader, m.Header.MsgID, m.Type())
		}
	}
	if ExecuteRequest.Reply() != ExecuteReply || StatusMsg.Reply() != "" {
		t.Error("Reply of execute_request or status")
	}
}

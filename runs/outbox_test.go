package runs

import (
	"fmt"
	"strings"
	"testing"

	"kernelgate/jupyter"
)

func msg(t *testing.T, typ jupyter.MsgType, text string) *jupyter.Message {
	t.Helper()
	m, err := jupyter.NewMessage("s", typ, map[string]string{"name": "stdout", "text": text}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestQueueKeepsHeadAndTailOfOutputWithAMarker(t *testing.T) {
	q := NewOutbox(4, 1<<20)
	parent := msg(t, jupyter.ExecuteRequest, "")
	for i := 0; i < 10; i++ {
		m := msg(t, jupyter.StreamMsg, fmt.Sprintf("line %d", i))
		m.RawParent, m.ParentID = parent.RawHeader, parent.Header.MsgID
		if !q.Push(Outgoing{Channel: jupyter.IOPub, Msg: m}) {
			t.Fatalf("push %d refused", i)
		}
	}
	var got []string
	for _, o := range q.Take() {
		var c struct{ Text string }
		o.Msg.DecodeContent(&c)
		got = append(got, c.Text)
		if o.Msg.ParentID != parent.Header.MsgID {
			t.Errorf("%q has parent %q", c.Text, o.Msg.ParentID)
		}
	}
	if len(got) != 5 || got[0] != "line 0" || got[1] != "line 1" || !strings.Contains(got[2], "6 output messages") || got[3] != "line 8" || got[4] != "line 9" {
		t.Fatalf("queue gave %q, want the head, the marker, the tail", got)
	}
	if q.Len() != 0 || q.dropped != 0 {
		t.Errorf("queue not empty after take")
	}

	// Status and replies are kept past the soft limit, before the marker.
	for i := 0; i < 6; i++ {
		q.Push(Outgoing{Channel: jupyter.IOPub, Msg: msg(t, jupyter.StreamMsg, "x")})
	}
	if !q.Push(Outgoing{Channel: jupyter.IOPub, Msg: msg(t, jupyter.StatusMsg, "")}) || !q.Push(Outgoing{Channel: jupyter.Shell, Msg: msg(t, jupyter.ExecuteReply, "")}) {
		t.Fatal("protocol messages refused")
	}
	var types []string
	for _, o := range q.Take() {
		types = append(types, string(o.Msg.Type()))
	}
	if got := strings.Join(types, ","); got != "stream,stream,stream,status,execute_reply" { // head, marker, the protocol
		t.Fatalf("queue gave %s", got)
	}
	// Past twice the limits even protocol messages are refused.
	for i := 0; i < 8; i++ {
		q.Push(Outgoing{Channel: jupyter.IOPub, Msg: msg(t, jupyter.StatusMsg, "")})
	}
	if q.Push(Outgoing{Channel: jupyter.IOPub, Msg: msg(t, jupyter.StatusMsg, "")}) {
		t.Error("a queue over its hard limit took a message")
	}
}

package sessions

import (
	"strings"
	"testing"

	"kernelgate/jupyter"
)

func msg(t *testing.T, typ jupyter.MsgType, text string) *Message {
	t.Helper()
	m, err := jupyter.NewMessage("s", typ, map[string]string{"name": "stdout", "text": text}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestQueueDropsOutputPastItsLimitsWithAMarker(t *testing.T) {
	q := newQueue(3, 1<<20)
	parent := msg(t, jupyter.ExecuteRequest, "")
	for i := 0; i < 10; i++ {
		m := msg(t, jupyter.StreamMsg, "line")
		m.RawParent, m.ParentID = parent.RawHeader, parent.Header.MsgID
		if !q.push(Outgoing{Channel: IOPub, Msg: m}) {
			t.Fatalf("push %d refused", i)
		}
	}
	// Status and replies are kept past the soft limit.
	if !q.push(Outgoing{Channel: IOPub, Msg: msg(t, jupyter.StatusMsg, "")}) || !q.push(Outgoing{Channel: Shell, Msg: msg(t, jupyter.ExecuteReply, "")}) {
		t.Fatal("protocol messages refused")
	}
	items := q.take()
	var types []string
	for _, o := range items {
		types = append(types, string(o.Msg.Type()))
	}
	if got := strings.Join(types, ","); got != "stream,stream,stream,stream,status,execute_reply" {
		t.Fatalf("queue gave %s", got)
	}
	marker := items[3].Msg // where dropping began
	if !strings.Contains(string(marker.RawContent), "7 output messages") || marker.ParentID != parent.Header.MsgID {
		t.Errorf("marker %s with parent %q", marker.RawContent, marker.ParentID)
	}
	if q.len() != 0 || q.dropped != 0 {
		t.Errorf("queue not empty after take")
	}
	// Past twice the limits even protocol messages are refused.
	for i := 0; i < 6; i++ {
		q.push(Outgoing{Channel: IOPub, Msg: msg(t, jupyter.StatusMsg, "")})
	}
	if q.push(Outgoing{Channel: IOPub, Msg: msg(t, jupyter.StatusMsg, "")}) {
		t.Error("a queue over its hard limit took a message")
	}
}

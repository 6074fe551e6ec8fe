package sessions

import (
	"fmt"

	"kernelgate/jupyter"
)

// Outgoing is one message for a client, with the channel it came on.
type Outgoing struct {
	Channel Channel
	Msg     *Message
}

// queue holds messages for a client, or for the next client while none is
// connected. Past its limits it drops output messages (stream, display and
// results) and keeps the ones the protocol needs (status, replies, errors);
// a marker on stderr says what was dropped. Past twice the limits it is
// over: the holder decides (a client is disconnected, the replay buffer
// drops everything).
type queue struct {
	maxMsgs, maxBytes int
	items             []Outgoing
	bytes             int

	dropped, droppedBytes int
	dropParent            *Message
	dropAt                int // where the marker goes: where dropping began
}

func newQueue(maxMsgs, maxBytes int) queue { return queue{maxMsgs: maxMsgs, maxBytes: maxBytes} }

// droppable is output a client can lose without breaking the protocol.
func droppable(o Outgoing) bool {
	if o.Channel != IOPub {
		return false
	}
	switch o.Msg.Type() {
	case jupyter.StreamMsg, jupyter.DisplayData, jupyter.UpdateDisplayData, jupyter.ExecuteResult, "comm_msg":
		return true
	}
	return false
}

// push adds o unless the queue is full; it reports false when the queue is
// over its hard limit and o was not kept.
func (q *queue) push(o Outgoing) bool {
	size := o.Msg.Size()
	full := len(q.items) >= q.maxMsgs || q.bytes+size > q.maxBytes
	if full && droppable(o) {
		q.drop(o, size)
		return true
	}
	if len(q.items) >= 2*q.maxMsgs || q.bytes+size > 2*q.maxBytes {
		q.drop(o, size)
		return false
	}
	if q.dropped > 0 && !full {
		q.appendMarker()
	}
	q.items = append(q.items, o)
	q.bytes += size
	return true
}

func (q *queue) drop(o Outgoing, size int) {
	q.dropped++
	q.droppedBytes += size
	if q.dropParent == nil {
		q.dropParent = o.Msg
		q.dropAt = len(q.items)
	}
}

// take removes and returns everything queued, with the marker of what was
// dropped where dropping began.
func (q *queue) take() []Outgoing {
	if q.dropped > 0 {
		q.appendMarker()
	}
	items := q.items
	q.items, q.bytes = nil, 0
	return items
}

func (q *queue) len() int { return len(q.items) }

func (q *queue) appendMarker() {
	text := fmt.Sprintf("[kernelgate] %d output messages (%d bytes) were dropped here: the client could not keep up or was away too long.\n",
		q.dropped, q.droppedBytes)
	m, err := jupyter.NewMessage("kernelgate", jupyter.StreamMsg, map[string]string{"name": "stderr", "text": text}, nil)
	if err == nil {
		m.RawParent, m.ParentID, m.ParentType = q.dropParent.RawParent, q.dropParent.ParentID, q.dropParent.ParentType
		at := min(q.dropAt, len(q.items))
		q.items = append(q.items, Outgoing{})
		copy(q.items[at+1:], q.items[at:])
		q.items[at] = Outgoing{Channel: IOPub, Msg: m}
		q.bytes += m.Size()
	}
	q.dropped, q.droppedBytes, q.dropParent = 0, 0, nil
}

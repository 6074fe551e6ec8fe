package runs

import (
	"fmt"

	"kernelgate/jupyter"
)

// Outgoing is one message for a client, with the channel it came on.
type Outgoing struct {
	Channel jupyter.Channel
	Msg     *jupyter.Message
}

// Outbox holds messages for a client, or for the next client while none is
// connected. Past its limits it keeps a head and a tail of the output
// messages (stream, display and results): the head is what came first,
// within half the limits, the tail the newest output within the rest, and
// a marker on stderr between them says what was dropped. Messages the
// protocol needs (status, replies, errors) are always kept. Past twice the
// limits it is over: the holder decides (a client is disconnected, the
// replay buffer drops everything).
type Outbox struct {
	maxMsgs, maxBytes int
	items             []Outgoing // the head, and all while nothing was dropped
	bytes             int

	// Once output was dropped, the newest is kept in tail[tailStart:].
	tail       []Outgoing
	tailStart  int
	tailBytes  int
	dropping   bool
	dropped    int
	dropBytes  int
	dropParent *jupyter.Message
}

// NewOutbox returns an outbox of at most maxMsgs messages and maxBytes
// bytes (twice that before it is over).
func NewOutbox(maxMsgs, maxBytes int) Outbox { return Outbox{maxMsgs: maxMsgs, maxBytes: maxBytes} }

// droppable is output a client can lose without breaking the protocol.
func droppable(o Outgoing) bool {
	if o.Channel != jupyter.IOPub {
		return false
	}
	switch o.Msg.Type() {
	case jupyter.StreamMsg, jupyter.DisplayData, jupyter.UpdateDisplayData, jupyter.ExecuteResult, "comm_msg":
		return true
	}
	return false
}

// Push adds o, dropping older output past the limits; it reports false
// when the outbox is over its hard limit and o was not kept.
func (q *Outbox) Push(o Outgoing) bool {
	size := o.Msg.Size()
	n, bytes := q.Len(), q.bytes+q.tailBytes
	if n >= 2*q.maxMsgs || bytes+size > 2*q.maxBytes {
		q.drop(o.Msg, size)
		return false
	}
	if !q.dropping {
		if n < q.maxMsgs && bytes+size <= q.maxBytes || !droppable(o) {
			q.items = append(q.items, o)
			q.bytes += size
			return true
		}
		q.startDropping()
	}
	q.tail = append(q.tail, o)
	q.tailBytes += size
	// Drop the oldest output of the tail past the limits.
	for q.tailStart < len(q.tail) && (q.Len() > q.maxMsgs || q.bytes+q.tailBytes > q.maxBytes) {
		old := q.tail[q.tailStart]
		q.tail[q.tailStart] = Outgoing{}
		q.tailStart++
		size := old.Msg.Size()
		q.tailBytes -= size
		if droppable(old) {
			q.drop(old.Msg, size)
		} else {
			// Kept, before the marker: nothing between them was kept.
			q.items = append(q.items, old)
			q.bytes += size
		}
	}
	if q.tailStart > 64 && q.tailStart > len(q.tail)/2 {
		k := copy(q.tail, q.tail[q.tailStart:])
		clear(q.tail[k:])
		q.tail, q.tailStart = q.tail[:k], 0
	}
	return true
}

// startDropping ends the head: its newest output is dropped down to half
// the limits, leaving the other half to the tail.
func (q *Outbox) startDropping() {
	q.dropping = true
	keep := q.items[:0]
	var bytes int
	// The head keeps its first messages within half the limits, and
	// whatever the protocol needs after them.
	full := false
	for _, o := range q.items {
		size := o.Msg.Size()
		if !full && (len(keep) >= q.maxMsgs/2 || bytes+size > q.maxBytes/2) && droppable(o) {
			full = true
		}
		if full && droppable(o) {
			q.drop(o.Msg, size)
			continue
		}
		keep = append(keep, o)
		bytes += size
	}
	clear(q.items[len(keep):])
	q.items, q.bytes = keep, bytes
}

func (q *Outbox) drop(m *jupyter.Message, size int) {
	q.dropped++
	q.dropBytes += size
	if q.dropParent == nil {
		q.dropParent = m
	}
}

// Take removes and returns everything queued: the head, the marker of what
// was dropped, the tail.
func (q *Outbox) Take() []Outgoing {
	items := q.items
	if q.dropped > 0 {
		if m := q.marker(); m != nil {
			items = append(items, Outgoing{Channel: jupyter.IOPub, Msg: m})
		}
	}
	items = append(items, q.tail[q.tailStart:]...)
	*q = Outbox{maxMsgs: q.maxMsgs, maxBytes: q.maxBytes}
	return items
}

// Len is how many messages the outbox holds.
func (q *Outbox) Len() int { return len(q.items) + len(q.tail) - q.tailStart }

// Bytes is what the messages the outbox holds take.
func (q *Outbox) Bytes() int { return q.bytes + q.tailBytes }

// Dropped reports whether output was dropped since the last Take: Take
// then returns the marker that says so.
func (q *Outbox) Dropped() bool { return q.dropped > 0 }

// marker is the stream message that stands where output was dropped.
func (q *Outbox) marker() *jupyter.Message {
	text := fmt.Sprintf("[kernelgate] %d output messages (%d bytes) were dropped here: the client could not keep up or was away too long.\n",
		q.dropped, q.dropBytes)
	m, err := jupyter.NewMessage("kernelgate", jupyter.StreamMsg, map[string]string{"name": "stderr", "text": text}, nil)
	if err != nil {
		return nil
	}
	m.RawParent, m.ParentID, m.ParentType = q.dropParent.RawParent, q.dropParent.ParentID, q.dropParent.ParentType
	return m
}

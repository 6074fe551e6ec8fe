package sessions

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"

	"kernelgate/jupyter"
	"kernelgate/runs"
)

// ErrSlowClient closes a client that stopped reading.
var ErrSlowClient = errors.New("sessions: client too slow, its queue overflowed")

// maxClientCalls bounds the requests of one client awaiting a reply.
const maxClientCalls = 1024

// Client is one connection (a websocket) attached to a kernel: it sends to
// the kernel and reads what the kernel sends back, from a bounded queue.
type Client struct {
	k *Kernel
	// Session is the client's session id (may be empty).
	Session string

	mu     sync.Mutex
	q      runs.Outbox
	wake   chan struct{}
	done   chan struct{}
	closed bool
	err    error
	calls  map[string]*callRef
}

type callRef struct {
	jk   process
	call runs.Call
}

func newClient(k *Kernel, session string, maxMsgs, maxBytes int) *Client {
	return &Client{
		k: k, Session: session,
		q:     runs.NewOutbox(maxMsgs, maxBytes),
		wake:  make(chan struct{}, 1),
		done:  make(chan struct{}),
		calls: make(map[string]*callRef),
	}
}

// Kernel is the kernel the client is attached to.
func (c *Client) Kernel() *Kernel { return c.k }

// Done is closed when the client was closed, by Close, because its kernel
// was deleted, or because it could not keep up.
func (c *Client) Done() <-chan struct{} { return c.done }

// push queues o for the client; it never blocks. It reports false when
// the client's queue overflowed: the caller, which holds k.mu, detaches
// the client and cuts it once it has released k.mu (closing a client
// hands its requests to the kernel, which takes k.mu).
func (c *Client) push(o runs.Outgoing) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return true
	}
	if !c.q.Push(o) {
		c.mu.Unlock()
		return false
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return true
}

// Take returns the queued messages without waiting (nil when there are
// none). It returns an error once the client is closed and its queue
// drained.
func (c *Client) Take() ([]runs.Outgoing, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.q.Len() > 0 || c.q.Dropped() {
		return c.q.Take(), nil
	}
	if c.closed {
		return nil, c.err
	}
	return nil, nil
}

// Ready receives a value after messages were queued or the client was
// closed: the moment to Take again.
func (c *Client) Ready() <-chan struct{} { return c.wake }

// Send forwards a message from the client to the kernel on ch (shell,
// control or stdin), waiting while the kernel (re)starts. Replies and
// input requests answering it come back to this client.
func (c *Client) Send(ctx context.Context, ch Channel, m *Message) error {
	if ch != Shell && ch != Control && ch != Stdin {
		return ErrBadChannel
	}
	if ch == Shell && m.Type() == jupyter.ExecuteRequest && holdsNUL(m) {
		c.refuse(m, nulInCode)
		return nil
	}
	jk, err := c.k.ensure(ctx)
	if err != nil {
		return err
	}
	if ch == Stdin || !m.Type().IsRequest() {
		return jk.Send(ch, m)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClientClosed
	}
	if len(c.calls) >= maxClientCalls {
		for id, r := range c.calls { // forget one that never got its reply
			r.jk.Forget(r.call)
			delete(c.calls, id)
			break
		}
	}
	c.mu.Unlock()
	held := m.Type() == jupyter.ExecuteRequest && c.k.holdIdleFor(m.Header.MsgID)
	call, err := jk.Request(ch, m, c.answer, jupyter.CallOptions{})
	if err != nil {
		if held {
			c.k.unholdIdle(m.Header.MsgID)
		}
		if errors.Is(err, jupyter.ErrDuplicateRequest) {
			return errorf(ErrConflict, "%v", err)
		}
		return err
	}
	c.mu.Lock()
	select {
	case <-call.Done(): // answered already
	default:
		if c.calls != nil {
			c.calls[m.Header.MsgID] = &callRef{jk: jk, call: call}
		}
	}
	c.mu.Unlock()
	return nil
}

// answer receives the replies and stdin requests of the client's requests.
func (c *Client) answer(ch Channel, m *Message) {
	if m.Type().IsReply() {
		c.mu.Lock()
		delete(c.calls, m.ParentID)
		c.mu.Unlock()
	}
	o := runs.Outgoing{Channel: ch, Msg: m}
	c.k.mu.Lock()
	to := c
	if _, attached := c.k.clients[c]; !attached {
		// The client went away. A client that reconnected with the same
		// session gets the answer; with none attached, the next one does.
		to = nil
		for other := range c.k.clients {
			if c.Session != "" && other.Session == c.Session {
				to = other
				break
			}
		}
		if to == nil {
			var slow []*Client
			if len(c.k.clients) == 0 {
				c.k.offline.Push(o)
			} else if m.Type().IsReply() {
				// Clients of other sessions attached after this one left:
				// the reply is theirs as the run's iopub output is (had it
				// come a moment earlier, the replay would have given it).
				// An input request is not: it would prompt another user.
				slow = c.k.deliverLocked(o)
			}
			c.k.mu.Unlock()
			cut(slow)
			return
		}
	}
	slow := !to.push(o)
	if slow {
		delete(c.k.clients, to)
	}
	c.k.mu.Unlock()
	if slow {
		to.closeWith(ErrSlowClient)
	}
}

// Close detaches the client from its kernel.
func (c *Client) Close() {
	c.closeWith(ErrClientClosed)
	c.k.detach(c)
}

func (c *Client) closeWith(err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed, c.err = true, err
	close(c.done)
	calls := c.calls
	c.calls = nil
	c.mu.Unlock()
	// Answers still due go to the next client (see answer); the kernel
	// bounds how many it waits for.
	c.k.orphan(calls)
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// nulInCode says why code holding a NUL is refused.
const nulInCode = "code contains a NUL character (U+0000), which a kernel drops without an answer: remove it"

// holdsNUL reports whether the code of execute_request m holds a NUL
// (ipykernel never answers such a request). Content without an escaped
// or raw NUL is not decoded.
func holdsNUL(m *Message) bool {
	if !bytes.Contains(m.RawContent, []byte(`\u0000`)) && bytes.IndexByte(m.RawContent, 0) < 0 {
		return false
	}
	var content struct {
		Code string `json:"code"`
	}
	return m.DecodeContent(&content) == nil && strings.ContainsRune(content.Code, 0)
}

// refuse answers an execute_request the kernel cannot take as a kernel
// answers code that fails, without sending it to the kernel: status busy,
// an error, an execute_reply with status error, status idle, to this
// client only.
func (c *Client) refuse(req *Message, why string) { c.answerRefused(Shell, req, why) }

// Refuse answers a message of this client that cannot go to the kernel,
// to this client only, as a kernel answers what it cannot do: a request
// with its reply of status error on ch between status busy and idle (an
// execute_request also with an error on iopub); anything else, or a
// message whose type cannot be read, with an error message on ch. header
// is the message's raw header, as the client sent it: the answers carry
// it as their parent header when it is a JSON object.
func (c *Client) Refuse(ch Channel, header []byte, why string) {
	c.answerRefused(ch, jupyter.HeaderOf(header), why)
}

func (c *Client) answerRefused(ch Channel, req *Message, why string) {
	failure := map[string]any{"ename": "BadRequest", "evalue": why, "traceback": []string{"BadRequest: " + why}}
	type step struct {
		ch      Channel
		t       MsgType
		content any
	}
	var steps []step
	switch t := req.Type(); {
	case t.IsRequest():
		reply := map[string]any{"status": "error", "ename": "BadRequest", "evalue": why, "traceback": []string{}}
		steps = append(steps, step{IOPub, jupyter.StatusMsg, map[string]string{"execution_state": "busy"}})
		if t == jupyter.ExecuteRequest {
			reply["execution_count"] = nil
			steps = append(steps, step{IOPub, jupyter.ErrorMsg, failure})
		}
		steps = append(steps,
			step{ch, t.Reply(), reply},
			step{IOPub, jupyter.StatusMsg, map[string]string{"execution_state": "idle"}})
	default:
		steps = append(steps, step{ch, jupyter.ErrorMsg, failure})
	}
	for _, s := range steps {
		m, err := jupyter.NewMessage(c.k.m.session, s.t, s.content, req)
		if err != nil {
			return
		}
		c.answer(s.ch, m)
	}
}

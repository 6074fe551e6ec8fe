package gateway

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/websocket"

	"kernelgate/jupyter"
	"kernelgate/sessions"
)

// sendRaw sends one message built from raw JSON parts on channel, in the
// client's framing; the legacy framing puts the channel in the envelope.
func (c *wsClient) sendRaw(channel, header, content string) {
	c.t.Helper()
	var mt int
	var data []byte
	if c.v1 {
		var b bytes.Buffer
		writeV1(&b, channel, &sessions.Message{RawHeader: []byte(header), RawParent: []byte("{}"), RawMetadata: []byte("{}"), RawContent: []byte(content)})
		mt, data = websocket.BinaryMessage, b.Bytes()
	} else {
		mt = websocket.TextMessage
		data = fmt.Appendf(nil, `{"header":%s,"parent_header":{},"metadata":{},"content":%s,"channel":%q}`, header, content, channel)
	}
	if err := c.conn.WriteMessage(mt, data); err != nil {
		c.t.Fatal(err)
	}
}

// gatewayClientHeader is a header as jupyter_server's GatewayKernelClient
// (what nbclient, nbconvert and papermill use through GatewayKernelManager)
// sends it: the date in epoch seconds, a number.
func gatewayClientHeader(msgID string, t jupyter.MsgType) string {
	return fmt.Sprintf(`{"msg_id":%q,"msg_type":%q,"username":"nb","session":"s-1","date":1796666662.028,"version":"5.3"}`, msgID, t)
}

// A header Jupyter Server forwards (a date as a number, a null username)
// reaches the kernel, Python's and Deno's, in every framing.
func TestWebsocketTakesHeadersJupyterServerForwards(t *testing.T) {
	g := newGateway(t)
	for _, spec := range []string{"python3", "deno"} {
		k := g.startKernel(spec)
		for _, v1 := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/v1=%v", spec, v1), func(t *testing.T) {
				c := g.mustDial(k.ID, v1)
				info := uuid.NewString()
				c.sendRaw("shell", gatewayClientHeader(info, jupyter.KernelInfoRequest), "{}")
				got := c.until(30*time.Second, func(m wsMsg) bool {
					return m.Channel == "shell" && m.ParentHeader.MsgID == info
				})
				if r := got[len(got)-1]; r.Header.MsgType != jupyter.KernelInfoReply || !strings.Contains(string(r.Content), `"status":"ok"`) && !strings.Contains(string(r.Content), `"status": "ok"`) {
					t.Fatalf("kernel_info_request with a numeric date: got %s %s", r.Header.MsgType, r.Content)
				}

				run := uuid.NewString()
				header := strings.Replace(gatewayClientHeader(run, jupyter.ExecuteRequest), `"username":"nb"`, `"username":null`, 1)
				c.sendRaw("shell", header, `{"code":"6*7","silent":false,"store_history":true,"user_expressions":{},"allow_stdin":false,"stop_on_error":true}`)
				msgs := c.untilDone(30*time.Second, run)
				var result string
				for _, m := range msgs {
					if m.ParentHeader.MsgID == run && m.Header.MsgType == jupyter.ExecuteResult {
						result = stripANSI(m.text(t))
					}
				}
				if result != "42" {
					t.Fatalf("execute_request with a numeric date: result %q; got %s", result, summary(msgs))
				}
			})
		}
	}
}

// A message the gateway cannot forward is answered on its channel with an
// error, to the client that sent it, and logged; the kernel keeps working.
func TestWebsocketUnreadableMessageIsAnswered(t *testing.T) {
	var logs lockedBuffer
	g := newGateway(t, b4Logs(&logs))
	k := g.startKernel("python3")
	for _, v1 := range []bool{false, true} {
		t.Run(fmt.Sprintf("v1=%v", v1), func(t *testing.T) {
			c := g.mustDial(k.ID, v1)
			other := g.mustDial(k.ID, v1)

			// A request whose msg_id is not a string: its reply, with
			// status error, between busy and idle, on its channel.
			for _, ch := range []string{"shell", "control"} {
				session := "probe-" + uuid.NewString()
				before := strings.Count(logs.String(), "could not be forwarded")
				c.sendRaw(ch, fmt.Sprintf(`{"msg_id":5,"msg_type":"kernel_info_request","session":%q,"date":"2026-01-01T00:00:00Z"}`, session), "{}")
				var reply wsMsg
				got := c.until(10*time.Second, func(m wsMsg) bool {
					if m.ParentHeader.Session != session {
						return false
					}
					if m.Header.MsgType == jupyter.KernelInfoReply {
						reply = m
					}
					return m.Channel == "iopub" && m.state() == "idle"
				})
				if reply.Channel != ch || !strings.Contains(string(reply.Content), `"status":"error"`) || !strings.Contains(string(reply.Content), "msg_id is not a string") {
					t.Fatalf("on %s: want a kernel_info_reply with status error on %s; got %s (reply %s %s)", ch, ch, summary(got), reply.Channel, reply.Content)
				}
				if after := strings.Count(logs.String(), "could not be forwarded"); after != before+1 {
					t.Errorf("on %s: %d log lines about the message, want 1", ch, after-before)
				}
			}

			// An execute_request whose content is not an object: answered
			// as failed code is, so a front-end's request ends.
			run := uuid.NewString()
			c.sendRaw("shell", gatewayClientHeader(run, jupyter.ExecuteRequest), `["print(1)"]`)
			var steps []string
			for _, m := range c.untilDone(10*time.Second, run) {
				if m.ParentHeader.MsgID == run {
					steps = append(steps, m.Channel+":"+string(m.Header.MsgType)+":"+m.state())
				}
			}
			if want := "iopub:status:busy iopub:error: shell:execute_reply: iopub:status:idle"; strings.Join(steps, " ") != want {
				t.Fatalf("execute_request with an array for content: got %q, want %q", strings.Join(steps, " "), want)
			}

			// Not a message at all, or one whose type cannot be read: an
			// error on its channel (shell when it names none).
			mt, broken := websocket.TextMessage, []byte(`{"header": {`)
			if v1 {
				mt, broken = websocket.BinaryMessage, []byte{1, 2, 3}
			}
			if err := c.conn.WriteMessage(mt, broken); err != nil {
				t.Fatal(err)
			}
			got := c.until(10*time.Second, func(m wsMsg) bool { return m.Header.MsgType == jupyter.ErrorMsg })
			if m := got[len(got)-1]; m.Channel != "shell" || m.ParentHeader.MsgID != "" {
				t.Fatalf("a broken frame: got an error on %s with parent %+v", m.Channel, m.ParentHeader)
			}
			comm := uuid.NewString()
			c.sendRaw("shell", fmt.Sprintf(`{"msg_id":%q,"msg_type":["comm_msg"]}`, comm), "{}")
			got = c.until(10*time.Second, func(m wsMsg) bool { return m.ParentHeader.MsgID == comm })
			if m := got[len(got)-1]; m.Channel != "shell" || m.Header.MsgType != jupyter.ErrorMsg || !strings.Contains(string(m.Content), "msg_type is not a string") {
				t.Fatalf("a msg_type that is no string: got %s %s %s", m.Channel, m.Header.MsgType, m.Content)
			}

			// The answers went to the client that sent the messages only,
			// and the kernel still runs code for both.
			run = other.execute("6*7", false)
			msgs := other.untilDone(30*time.Second, run)
			for _, m := range msgs {
				if m.Header.MsgType == jupyter.ErrorMsg || strings.Contains(string(m.Content), "BadRequest") {
					t.Fatalf("another client got an answer meant for the sender: %s %s", m.Header.MsgType, m.Content)
				}
			}
			if resultText(t, msgs) != "42" {
				t.Fatalf("after the refused messages, 6*7: %s", summary(msgs))
			}
			if _, iopub := c.run("1+1"); resultText(t, iopub) != "2" {
				t.Fatal("the sender's next request was not answered")
			}
		})
	}
	if strings.Contains(logs.String(), "print(1)") {
		t.Error("the log holds a message's content")
	}
}

// A request sent again with the msg_id of one still running is not
// forwarded, and not answered either: an answer with that parent would end
// the running request for the client.
func TestWebsocketRepeatedMsgIDIsNotAnswered(t *testing.T) {
	var logs lockedBuffer
	g := newGateway(t, b4Logs(&logs))
	k := g.startKernel("python3")
	c := g.mustDial(k.ID, false)
	run := uuid.NewString()
	header := gatewayClientHeader(run, jupyter.ExecuteRequest)
	content := `{"code":"import time; time.sleep(1); 6*7","silent":false,"store_history":true,"user_expressions":{},"allow_stdin":false}`
	c.sendRaw("shell", header, content)
	c.sendRaw("shell", header, content)
	msgs := c.untilDone(30*time.Second, run)
	var replies []string
	for _, m := range msgs {
		if m.Header.MsgType == jupyter.ExecuteReply {
			replies = append(replies, string(m.Content))
		}
	}
	if len(replies) != 1 || !strings.Contains(replies[0], `"status": "ok"`) || resultText(t, msgs) != "42" {
		t.Fatalf("the running request's messages: %s; replies %q", summary(msgs), replies)
	}
	if !strings.Contains(logs.String(), "already awaiting a reply") {
		t.Errorf("the repeated request was not logged:\n%s", logs.String())
	}
}

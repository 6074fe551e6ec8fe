package gateway

import (
	"encoding/json"
	"testing"
	"time"

	"kernelgate/jupyter"
)

// An execute_request whose code holds a NUL, which ipykernel would never
// answer, gets an error reply and its idle status over the websocket, as
// failing code does; the kernel then runs the next request.
func TestNULCodeOverWebsocketIsRefused(t *testing.T) {
	g := newGateway(t)
	model := g.startKernel("python3")
	ws := g.mustDial(model.ID, true)
	id := ws.execute("x = \"a\x00b\"", false)
	var reply wsMsg
	gotReply, gotIdle, gotError := false, false, false
	ws.until(30*time.Second, func(m wsMsg) bool {
		if m.ParentHeader.MsgID != id {
			return false
		}
		switch {
		case m.Channel == "shell" && m.Header.MsgType == jupyter.ExecuteReply:
			reply, gotReply = m, true
		case m.Channel == "iopub" && m.Header.MsgType == jupyter.ErrorMsg:
			gotError = true
		case m.Channel == "iopub" && m.state() == "idle":
			gotIdle = true
		}
		return gotReply && gotIdle
	})
	var content struct {
		Status string `json:"status"`
		EName  string `json:"ename"`
	}
	json.Unmarshal(reply.Content, &content)
	if content.Status != "error" || content.EName != "BadRequest" || !gotError {
		t.Errorf("reply %s (error message published: %v); want status error, ename BadRequest", reply.Content, gotError)
	}
	if _, iopub := ws.run("1 + 1"); resultText(t, iopub) != "2" {
		t.Errorf("the next request: %s", summary(iopub))
	}
}

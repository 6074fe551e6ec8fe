package gateway

import (
	"testing"
	"time"

	"kernelgate/jupyter"
)

// Deno publishes some execute_results after its status: idle, and Jupyter
// clients take reply + idle for the end of a request. Over the websocket
// every request's result arrives before its idle status.
func TestDenoResultArrivesBeforeIdleOverWebsocket(t *testing.T) {
	g := newGateway(t)
	k := g.startKernel("deno")
	c := g.mustDial(k.ID, true)
	// With console output ahead of it, Deno's result follows the idle
	// status in about a quarter of the runs.
	for i := 0; i < 100; i++ {
		id := c.execute("console.log('hi'); 5", false)
		var idle, result, reply bool
		c.until(30*time.Second, func(m wsMsg) bool {
			if m.ParentHeader.MsgID != id {
				return false
			}
			switch {
			case m.Header.MsgType == jupyter.ExecuteResult:
				if idle {
					t.Fatalf("run %d: the execute_result came after the idle status", i)
				}
				result = true
			case m.Header.MsgType == jupyter.ExecuteReply:
				reply = true
			case m.state() == "idle":
				if !result {
					t.Fatalf("run %d: idle status before the execute_result", i)
				}
				idle = true
			}
			return idle && reply
		})
	}
}

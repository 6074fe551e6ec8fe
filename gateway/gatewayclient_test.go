package gateway

import (
	"net/http"
	"testing"
	"time"

	"kernelgate/jupyter"
)

// What Jupyter Server 1.x's GatewayClient does to kernelgate around a new
// kernel: it retries the websocket of a kernel just deleted (404), leaves
// open a websocket without session_id that it never reads (its client
// left before the connection was up), and opens another without
// session_id whose first message comes at once. The new kernel answers
// that message: the hang seen through that client is the client's
// (README, "Jupyter Server 1.x with --gateway-url").
func TestFirstMessageBesideDeletedKernelRetries(t *testing.T) {
	g := newGateway(t)
	auth := http.Header{"Authorization": {"token " + g.token}}
	py := g.startKernel("python3")
	old := g.mustDial(py.ID, false)
	old.run("1+1")
	if status, body := g.do("DELETE", "/api/kernels/"+py.ID, nil); status != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", status, body)
	}

	for _, spec := range []string{"deno", "python3"} {
		t.Run(spec, func(t *testing.T) {
			k := g.startKernel(spec)
			retried := make(chan int, 1)
			go func() {
				_, resp, err := g.dialURL(py.ID, "", auth)
				if err == nil || resp == nil {
					retried <- 0
					return
				}
				retried <- resp.StatusCode
			}()
			unread, _, err := g.dialURL(k.ID, "", auth) // never read
			if err != nil {
				t.Fatal(err)
			}
			defer unread.Close()
			c, _, err := g.dial(k.ID, "", false, auth)
			if err != nil {
				t.Fatal(err)
			}
			id := c.send("shell", jupyter.KernelInfoRequest, nil, nil)
			c.until(30*time.Second, func(m wsMsg) bool {
				return m.Channel == "shell" && m.Header.MsgType == jupyter.KernelInfoReply && m.ParentHeader.MsgID == id
			})
			if status := <-retried; status != http.StatusNotFound {
				t.Errorf("the deleted kernel's websocket: status %d, want 404", status)
			}
			run := c.execute("6*7", false)
			if got := resultText(t, c.untilDone(30*time.Second, run)); got != "42" {
				t.Errorf("6*7 = %q", got)
			}
		})
	}
}

package gateway

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"kernelgate/sessions"
)

// A websocket client that stops reading while its request runs is cut
// (ErrSlowClient), and the gateway keeps answering meanwhile: the kernel
// list, the status and the metrics, and then the kernel for a new client.
func TestSlowWebsocketClientIsCutAndTheGatewayAnswers(t *testing.T) {
	g := newGateway(t, func(mc *sessions.Config, gc *Config) { mc.ClientMessages = 2500 })
	k := g.startKernel("python3")
	session := uuid.NewString()
	conn, _, err := g.dialURL(k.ID, "?session_id="+session, http.Header{"Authorization": {"token " + g.token}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// This client never reads. Its request floods iopub with messages a
	// client cannot lose (clear_output), more than the socket buffers hold,
	// and replies only at the end.
	slow := &wsClient{t: t, conn: conn, session: session}
	slow.execute("from IPython.display import clear_output\nfor _ in range(40000): clear_output()\n", false)

	// Every call below must answer promptly: a deadlock on the kernel's
	// lock hangs them.
	client := &http.Client{Timeout: 10 * time.Second}
	get := func(path string) []byte {
		t.Helper()
		req, _ := http.NewRequest("GET", g.url+path, nil)
		req.Header.Set("Authorization", "token "+g.token)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
		}
		return body
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var km sessions.KernelModel
		decodeInto(t, get("/api/kernels/"+k.ID), &km)
		get("/api/kernels")
		get("/api/status")
		get("/metrics")
		if km.Connections == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slow client was never cut")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The kernel serves the next client once the flood has ended.
	for {
		var km sessions.KernelModel
		decodeInto(t, get("/api/kernels/"+k.ID), &km)
		if km.ExecutionState == "idle" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the kernel never went idle after the flood")
		}
		time.Sleep(20 * time.Millisecond)
	}
	c := g.mustDial(k.ID, true)
	reply, iopub := c.run("6*7")
	if got := resultText(t, iopub); got != "42" {
		t.Fatalf("after the cut, 6*7 gave %q (reply %s)", got, reply.Content)
	}
}

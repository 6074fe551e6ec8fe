package gateway

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kernelgate/jupyter"
	"kernelgate/sessions"
)

func TestWebsocketExecute(t *testing.T) {
	g := newGateway(t)
	for _, kernel := range []string{"python3", "deno"} {
		k := g.startKernel(kernel)
		for _, v1 := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s v1=%v", kernel, v1), func(t *testing.T) {
				c := g.mustDial(k.ID, v1)
				if c.v1 != v1 {
					t.Fatalf("subprotocol v1 = %v, want %v", c.v1, v1)
				}
				reply, iopub := c.run("1+1")
				if reply.Header.MsgType != jupyter.ExecuteReply {
					t.Fatalf("reply %+v", reply.Header)
				}
				got := resultText(t, iopub)
				if got == "" { // Deno may publish the result just after idle
					got = stripANSI(c.until(5*time.Second, func(m wsMsg) bool { return m.Header.MsgType == jupyter.ExecuteResult })[0].text(t))
				}
				if got != "2" {
					t.Errorf("1+1 = %q", got)
				}
				c.conn.Close()
			})
		}
	}
}

func TestWebsocketBuffersRoundTrip(t *testing.T) {
	// A comm message with a binary buffer goes from the kernel to the
	// client intact, in both framings.
	g := newGateway(t)
	k := g.startKernel("python3")
	for _, v1 := range []bool{true, false} {
		c := g.mustDial(k.ID, v1)
		code := "from ipykernel.comm import Comm\nc = Comm(target_name='t', data={})\nc.send(data={'x': 1}, buffers=[b'\\x00\\x01\\xff'])"
		_, iopub := c.run(code)
		found := false
		for _, m := range iopub {
			if m.Header.MsgType == "comm_msg" {
				found = len(m.Buffers) == 1 && string(m.Buffers[0]) == "\x00\x01\xff"
			}
		}
		if !found {
			t.Errorf("v1=%v: comm_msg buffer not delivered intact", v1)
		}
		c.conn.Close()
	}
}

func TestWebsocketInput(t *testing.T) {
	g := newGateway(t)
	k := g.startKernel("python3")
	for _, v1 := range []bool{true, false} {
		c := g.mustDial(k.ID, v1)
		id := c.execute("name = input('name? ')\nprint('hello', name)", true)
		req := c.until(10*time.Second, func(m wsMsg) bool { return m.Header.MsgType == jupyter.InputRequest })
		in := req[len(req)-1]
		if in.Channel != "stdin" || in.ParentHeader.MsgID != id {
			t.Fatalf("input_request on %s with parent %s", in.Channel, in.ParentHeader.MsgID)
		}
		c.send("stdin", jupyter.InputReply, map[string]string{"value": "ada"}, &in.Header)
		out := c.until(10*time.Second, func(m wsMsg) bool { return m.Header.MsgType == jupyter.StreamMsg })
		if got := out[len(out)-1].text(t); got != "hello ada\n" {
			t.Errorf("v1=%v: stdout %q", v1, got)
		}
		c.conn.Close()
	}
}

func TestReplayOnReconnect(t *testing.T) {
	g := newGateway(t)
	k := g.startKernel("python3")
	c := g.mustDial(k.ID, true)
	// The run prints once its client has gone (it waits for a file the
	// test creates then).
	goAhead := filepath.Join(t.TempDir(), "go")
	id := c.execute(fmt.Sprintf("import os, time\nwhile not os.path.exists(%q): time.sleep(0.01)\nfor i in range(5):\n    print(i, flush=True)\n    time.sleep(0.2)", goAhead), false)
	c.until(10*time.Second, func(m wsMsg) bool { return m.Header.MsgType == jupyter.ExecuteInput })
	c.conn.Close()
	kk, _ := g.mgr.Kernel(k.ID)
	eventually(t, 5*time.Second, func() bool { return kk.Model().Connections == 0 })
	if err := os.WriteFile(goAhead, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Wait for the run to finish with nobody connected.
	eventually(t, 10*time.Second, func() bool { return kk.Model().ExecutionState == "idle" })
	// A different session gets everything, once, in order.
	c2 := g.mustDial(k.ID, false)
	got := c2.untilDone(10*time.Second, id)
	var out []string
	for _, m := range got {
		if m.Header.MsgType == jupyter.StreamMsg && m.ParentHeader.MsgID == id {
			out = append(out, m.text(t))
		}
	}
	if strings.Join(out, "") != "0\n1\n2\n3\n4\n" {
		t.Errorf("replayed stdout = %q", out)
	}
	c2.conn.Close()
	eventually(t, 5*time.Second, func() bool { return kk.Model().Connections == 0 })
	// Nothing is replayed twice.
	c3 := g.mustDial(k.ID, false)
	fresh := c3.execute("'fresh'", false)
	all := c3.until(10*time.Second, func(m wsMsg) bool {
		return m.Header.MsgType == jupyter.ExecuteReply && m.ParentHeader.MsgID == fresh
	})
	for _, m := range all {
		if m.ParentHeader.MsgID == id {
			t.Errorf("message of the earlier run replayed again: %s", m.Header.MsgType)
		}
	}
}

// eventually polls cond until it holds, failing the test after d.
func eventually(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("condition not met within %v", d)
		}
	}
}

func TestReplyReachesReconnectedSession(t *testing.T) {
	// A page drops its websocket during a run and reconnects at once with
	// the same session: the reply of its request reaches the new socket.
	g := newGateway(t)
	k := g.startKernel("python3")
	c, _, err := g.dial(k.ID, "page-session", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := c.execute("import time; time.sleep(1); print('done')", false)
	c.until(10*time.Second, func(m wsMsg) bool { return m.Header.MsgType == jupyter.ExecuteInput })
	c.conn.Close()
	kk, _ := g.mgr.Kernel(k.ID)
	eventually(t, 5*time.Second, func() bool { return kk.Model().Connections == 0 })
	c2, _, err := g.dial(k.ID, "page-session", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := c2.until(10*time.Second, func(m wsMsg) bool {
		return m.Header.MsgType == jupyter.ExecuteReply && m.ParentHeader.MsgID == id
	})
	if last := got[len(got)-1]; last.Channel != "shell" {
		t.Errorf("reply on %s", last.Channel)
	}
}

func TestReplayBufferIsBounded(t *testing.T) {
	g := newGateway(t, func(m *sessions.Config, _ *Config) { m.ReplayMessages = 20 })
	k := g.startKernel("python3")
	c := g.mustDial(k.ID, true)
	// The run prints once its client has gone (it waits for a file the
	// test creates then), so all 200 messages meet the replay buffer.
	goAhead := filepath.Join(t.TempDir(), "go")
	id := c.execute(fmt.Sprintf("import os, time\nwhile not os.path.exists(%q): time.sleep(0.01)\nfor i in range(200):\n    print(i, flush=True)", goAhead), false)
	c.until(10*time.Second, func(m wsMsg) bool { return m.Header.MsgType == jupyter.ExecuteInput })
	c.conn.Close()
	kk, _ := g.mgr.Kernel(k.ID)
	eventually(t, 10*time.Second, func() bool { return kk.Model().Connections == 0 })
	if err := os.WriteFile(goAhead, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() bool { return kk.Model().ExecutionState == "idle" })
	c2 := g.mustDial(k.ID, true)
	got := c2.untilDone(10*time.Second, id)
	streams, marker := 0, ""
	for _, m := range got {
		if m.Header.MsgType == jupyter.StreamMsg && m.ParentHeader.MsgID == id {
			if strings.Contains(m.text(t), "[kernelgate]") {
				marker = m.text(t)
			} else {
				streams++
			}
		}
	}
	if streams == 0 || streams > 20 || !strings.Contains(marker, "were dropped") {
		t.Errorf("replayed %d stream messages, marker %q; got %s", streams, marker, summary(got))
	}
}

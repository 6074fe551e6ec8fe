package gateway

// The checklist, 16-20: transport and messages (helpers in checklist_helpers_test.go).

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/websocket"

	"kernelgate/jupyter"
	"kernelgate/sessions"
)

// B4 #16: "100 MiB request body; slow-loris headers; 10 000 idle WS
// connections" → "413 without full buffering; header/read timeouts;
// per-principal connection cap".
//
// TestExecuteErrorCodes covers a 17 MiB body. Here: 100 MiB bodies on both
// surfaces are answered 413 while the client is still sending, and the
// gateway's memory does not grow by them; headers sent slowly are cut by
// ReadHeaderTimeout; websockets that stop answering pings are closed.
// Not covered because kernelgate has no such limit: a per-principal cap on
// connections, and a timeout on slowly sent bodies (http.Server has no
// ReadTimeout): see docs/security.md.
func TestB4_16_BodySizeAndSlowClients(t *testing.T) {
	g := newGateway(t, func(_ *sessions.Config, c *Config) { c.PingInterval = 250 * time.Millisecond })
	t.Run("100 MiB bodies", func(t *testing.T) {
		for _, c := range []struct {
			path    string
			chunked bool
		}{{"/api/execute", false}, {"/api/execute", true}, {"/api/kernels", false}, {"/api/contexts", true}} {
			// What the process allocated meanwhile (the gateway reads up to
			// its 16 MiB limit; this client has one 1 MiB chunk) stays under
			// the body's size.
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			status, sent := b4SendBody(t, g, c.path, 100<<20, c.chunked)
			runtime.ReadMemStats(&after)
			if status != http.StatusRequestEntityTooLarge {
				t.Errorf("POST %s (chunked %v) with 100 MiB: %d, want 413", c.path, c.chunked, status)
			}
			if sent >= 100<<20 {
				t.Errorf("POST %s (chunked %v): the answer came after the whole body was sent", c.path, c.chunked)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc >= 100<<20 {
				t.Errorf("POST %s (chunked %v): %d MiB allocated while refusing it", c.path, c.chunked, alloc>>20)
			}
		}
		if n := len(g.mgr.Kernels()); n != 0 {
			t.Errorf("%d kernels started", n)
		}
	})
	t.Run("slow headers", func(t *testing.T) {
		if got := g.srv.http.ReadHeaderTimeout; got != 10*time.Second {
			t.Errorf("ReadHeaderTimeout %v, want 10s", got)
		}
		if g.srv.http.IdleTimeout <= 0 {
			t.Errorf("no IdleTimeout")
		}
		// The server enforces it (lowered so the test need not wait 10 s).
		g.srv.http.ReadHeaderTimeout = 300 * time.Millisecond
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go g.srv.Serve(l)
		conn, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		io.WriteString(conn, "GET /api HTTP/1.1\r\nHost: x\r\nX-Slow: ")
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = io.Copy(io.Discard, conn)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("a connection with unfinished headers was not closed within 10 s")
		}
	})
	t.Run("idle websockets", func(t *testing.T) {
		k := g.startKernel("python3")
		kk, _ := g.mgr.Kernel(k.ID)
		live := g.mustDial(k.ID, true) // reads, so it answers pings
		// A client that never reads never answers a ping.
		mute, _, err := g.dialURL(k.ID, "?session_id=mute", http.Header{"Authorization": {"token " + testToken}})
		if err != nil {
			t.Fatal(err)
		}
		defer mute.Close()
		eventually(t, 5*time.Second, func() bool { return kk.Model().Connections == 1 })
		mute.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			if _, _, err := mute.ReadMessage(); err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					t.Fatalf("the mute websocket is still open")
				}
				break
			}
		}
		if got := b4WSResult(t, live, "6*7"); got != "42" {
			t.Errorf("the live websocket after many ping intervals: %q", got)
		}
	})
}

// B4 #17: "50 MiB WS frame / execute code" → "close 1009 or 413; kernel
// unaffected".
//
// With Config.MaxFrameBytes 1 MiB, a 2 MiB frame closes the websocket with
// 1009 (message too big) and the kernel still answers; frames under the
// limit pass. TestExecuteErrorCodes covers a 17 MiB body (413); here 50 MiB
// of code.
func TestB4_17_LargeFrame(t *testing.T) {
	g := newGateway(t, func(_ *sessions.Config, c *Config) { c.MaxFrameBytes = 1 << 20 })
	k := g.startKernel("python3")
	// Under the limit: runs.
	c := g.mustDial(k.ID, false)
	if got := b4WSResult(t, c, "#"+strings.Repeat("x", 900<<10)+"\n6*7"); got != "42" {
		t.Fatalf("a 900 KiB frame: %q", got)
	}
	conn, _, err := g.dialURL(k.ID, "?session_id=big", http.Header{"Authorization": {"token " + testToken}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	frame := b4ExecuteFrame("shell", "big", uuid.NewString(), "big = 1 #"+strings.Repeat("x", 2<<20))
	// The gateway may close while the frame is still being written: the
	// write's error does not matter, the close code does.
	go conn.WriteMessage(websocket.TextMessage, frame)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, _, err := conn.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.CloseMessageTooBig {
			t.Fatalf("after a 2 MiB frame: %v, want close 1009", err)
		}
		break
	}
	// The kernel is unaffected and never saw the frame.
	c2 := g.mustDial(k.ID, true)
	if got := b4WSResult(t, c2, "'big' in globals(), 6*7"); got != "(False, 42)" {
		t.Errorf("kernel after the oversized frame: %q", got)
	}
	if status, _ := b4SendBody(t, g, "/api/execute", 50<<20, false); status != http.StatusRequestEntityTooLarge {
		t.Errorf("50 MiB of code: %d, want 413", status)
	}
}

// B4 #18: "WS message not JSON / missing header / channel iopub,hb,../x /
// disallowed msg_type / forged header.session" → "dropped with error; never
// forwarded; connection policy documented".
//
// Policy: malformed frames and frames for any channel but shell, control
// and stdin are not forwarded (logged, and answered with an error to the
// sender when the channel exists) and the connection stays open.
// There is no msg_type allow-list: a client with the exec scope may send
// any request on shell or control. header.session is the client's and is
// forwarded as is; replies are routed by msg_id to the connection that sent
// the request, never by header.session.
func TestB4_18_MalformedWebsocketMessages(t *testing.T) {
	g := newGateway(t)
	k := g.startKernel("python3")
	victim := b4Dial(t, g, k.ID, "victim", true)
	conn, _, err := g.dialURL(k.ID, "?session_id=attacker", http.Header{"Authorization": {"token " + testToken}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw := func(mt int, b []byte) {
		t.Helper()
		if err := conn.WriteMessage(mt, b); err != nil {
			t.Fatalf("the connection was closed: %v", err)
		}
	}
	raw(websocket.TextMessage, []byte("not json"))
	raw(websocket.TextMessage, []byte(`{"channel":"shell"}`))
	raw(websocket.TextMessage, []byte(`{"channel":"shell","header":{"msg_type":"execute_request"},"content":{"code":"no_id = 1"}}`))
	raw(websocket.TextMessage, []byte(`{"channel":"shell","header":"x","content":{"code":"bad_header = 1"}}`))
	raw(websocket.TextMessage, []byte(`{"channel":"shell","header":{"msg_id":"x","msg_type":"execute_request"},"content":"not an object"}`))
	raw(websocket.TextMessage, []byte(strings.Repeat("[", 100000)))
	raw(websocket.BinaryMessage, []byte{0, 0, 0, 9, 0, 0, 0, 1})
	raw(websocket.BinaryMessage, []byte{0xff, 0xff, 0xff, 0xff})
	for ch, name := range map[string]string{"iopub": "forged_iopub", "hb": "forged_hb", "../x": "forged_x", "SHELL": "forged_upper", "shell\x00": "forged_nul", "stdin/../shell": "forged_path"} {
		raw(websocket.TextMessage, b4ExecuteFrame(ch, "attacker", uuid.NewString(), name+" = 1"))
	}
	// v1 framing: bad offsets and a foreign channel.
	victimConn := victim.conn
	victimConn.WriteMessage(websocket.BinaryMessage, []byte{7, 0, 0, 0, 0, 0, 0, 0, 255, 255})
	m, _ := jupyter.NewMessage("victim", jupyter.ExecuteRequest, jupyter.NewExecute("forged_v1_iopub = 1"), nil)
	var buf bytes.Buffer
	writeV1(&buf, "iopub", m)
	victimConn.WriteMessage(websocket.BinaryMessage, buf.Bytes())
	victim.run("'frames before this one were handled'")
	// An unknown request type is forwarded; the kernel ignores it.
	raw(websocket.TextMessage, []byte(`{"channel":"shell","header":{"msg_id":"`+uuid.NewString()+`","msg_type":"evil_request","session":"attacker","username":"x","version":"5.3"},"parent_header":{},"metadata":{},"content":{}}`))

	// A forged header.session: forwarded, but the reply goes to the sender.
	forged := uuid.NewString()
	raw(websocket.TextMessage, b4ExecuteFrame("shell", "victim", forged, "forged_session = 1"))
	attacker := &wsClient{t: t, conn: conn, session: "attacker", msgs: make(chan wsMsg, 1000)}
	go attacker.read()
	attacker.until(10*time.Second, func(m wsMsg) bool {
		return m.Channel == "shell" && m.Header.MsgType == jupyter.ExecuteReply && m.ParentHeader.MsgID == forged
	})
	got := b4WSResult(t, attacker, "sorted(n for n in ('no_id', 'bad_header', 'forged_iopub', 'forged_hb', 'forged_x', 'forged_upper', 'forged_nul', 'forged_path', 'forged_v1_iopub', 'forged_session') if n in globals())")
	if got != "['forged_session']" {
		t.Errorf("names defined by dropped messages: %s, want only ['forged_session']", got)
	}
	// The victim's connection works and never got the forged request's reply.
	own := victim.execute("6*7", false)
	for _, m := range victim.until(10*time.Second, func(m wsMsg) bool { return m.Channel == "shell" && m.ParentHeader.MsgID == own }) {
		if m.Channel == "shell" && m.ParentHeader.MsgID == forged {
			t.Errorf("the reply to a request with a forged header.session went to the session it named")
		}
	}
}

// B4 #19: "Fetch connection info / HMAC key via API, errors or logs" →
// "never exposed; gateway re-signs all messages".
//
// Everything a session produced (REST answers, errors, metrics, the
// OpenAPI document, raw websocket frames, streamed events and debug logs)
// is searched for the keys of every kernel, read from their connection
// files.
func TestB4_19_HMACKeyNeverExposed(t *testing.T) {
	var logs lockedBuffer
	g := newGateway(t, b4Logs(&logs))
	k := g.startKernel("python3")
	b4Context(t, g, map[string]any{"id": "ctx"})
	var haystack bytes.Buffer
	add := func(b []byte) { haystack.Write(b); haystack.WriteByte('\n') }

	// Websocket traffic, raw frames, both framings.
	for _, proto := range [][]string{nil, {v1Protocol}} {
		d := websocket.Dialer{Subprotocols: proto}
		u := "ws" + strings.TrimPrefix(g.url, "http") + "/api/kernels/" + k.ID + "/channels?session_id=s"
		conn, _, err := d.Dial(u, http.Header{"Authorization": {"token " + testToken}})
		if err != nil {
			t.Fatal(err)
		}
		id := uuid.NewString()
		frame := b4ExecuteFrame("shell", "s", id, "print('hello'); 1/0")
		if len(proto) > 0 {
			m, _ := jupyter.NewMessage("s", jupyter.ExecuteRequest, jupyter.NewExecute("print('hello'); 1/0"), nil)
			id = m.Header.MsgID
			var b bytes.Buffer
			writeV1(&b, "shell", m)
			conn.WriteMessage(websocket.BinaryMessage, b.Bytes())
		} else {
			conn.WriteMessage(websocket.TextMessage, frame)
		}
		info, _ := jupyter.NewMessage("s", jupyter.KernelInfoRequest, map[string]any{}, nil)
		if len(proto) > 0 {
			var b bytes.Buffer
			writeV1(&b, "shell", info)
			conn.WriteMessage(websocket.BinaryMessage, b.Bytes())
		} else {
			conn.WriteMessage(websocket.TextMessage, appendLegacyJSON(nil, "shell", info, true))
		}
		conn.SetReadDeadline(time.Now().Add(15 * time.Second))
		gotReply, gotInfo := false, false
		for !gotReply || !gotInfo {
			_, data, err := conn.ReadMessage()
			if err != nil {
				t.Fatalf("websocket: %v", err)
			}
			add(data)
			gotReply = gotReply || (bytes.Contains(data, []byte(`"execute_reply"`)) && bytes.Contains(data, []byte(id)))
			gotInfo = gotInfo || bytes.Contains(data, []byte(`"kernel_info_reply"`))
		}
		conn.Close()
	}
	var needles []string
	collect := func() {
		for _, kern := range g.mgr.Kernels() {
			path, ci := b4ConnFile(t, kern.PID())
			if ci.Key == "" {
				t.Fatalf("no key in %s", path)
			}
			needles = append(needles, ci.Key, path, filepath.Base(path))
		}
	}
	collect()
	// REST, both surfaces, successes and errors.
	e := g.run(map[string]any{"code": "import os; print(sorted(os.environ)); 1/0", "context": "ctx"})
	iso := g.run(map[string]any{"code": "print('iso')", "isolated": true})
	for _, p := range []string{
		"/api", "/api/status", "/api/kernelspecs", "/api/kernelspecs/python3", "/api/kernels", "/api/kernels/" + k.ID,
		"/api/sessions", "/api/contexts", "/api/contexts/ctx", "/api/runs/" + e.ID, "/api/runs/" + e.ID + "/events",
		"/api/runs/" + iso.ID, "/metrics", "/api/openapi.json", "/api/kernels/" + uuid.NewString(), "/api/contexts/nope",
		"/kernelspecs/python3/kernel.json",
	} {
		_, body := g.do("GET", p, nil)
		add(body)
	}
	for _, c := range []struct{ path, body string }{
		{"/api/kernels/" + k.ID + "/restart", ""}, {"/api/kernels", `{"name":"nope"}`}, {"/api/execute", `{"code":`},
		{"/api/execute", `{"code":"1","context":"nope"}`}, {"/api/kernels/" + k.ID + "/interrupt", ""},
	} {
		_, body := g.do("POST", c.path, c.body)
		add(body)
	}
	add([]byte(logs.String()))

	collect()
	for _, needle := range needles {
		if bytes.Contains(haystack.Bytes(), []byte(needle)) {
			t.Errorf("%q appears in what the gateway answered or logged", needle)
		}
	}
	if len(needles) < 3*3 || haystack.Len() < 10000 {
		t.Fatalf("checked %d needles against %d bytes", len(needles), haystack.Len())
	}
}

// B4 #20: "Two tenants' kernels and two sessions on one kernel" → "no
// cross-kernel iopub leakage; per-session routing by parent_header per
// policy".
//
// Policy, as jupyter_server: iopub of a kernel goes to every websocket of
// that kernel; a reply (shell, control) and stdin requests go only to the
// websocket whose request they answer. A client reusing the msg_id of
// another client's pending request must not take its reply.
func TestB4_20_NoCrossTalk(t *testing.T) {
	g := newGateway(t)
	k1 := g.startKernel("python3")
	k2 := g.startKernel("python3")
	a := b4Dial(t, g, k1.ID, "session-a", true)
	b := b4Dial(t, g, k1.ID, "session-b", false)
	other := b4Dial(t, g, k2.ID, "session-other", true)
	// requestDone waits for the reply and idle status of request id.
	requestDone := func(c *wsClient, id string) []wsMsg {
		reply, idle := false, false
		return c.until(15*time.Second, func(m wsMsg) bool {
			if m.ParentHeader.MsgID == id {
				reply = reply || (m.Channel == "shell" && m.Header.MsgType == jupyter.ExecuteReply)
				idle = idle || m.state() == "idle"
			}
			return reply && idle
		})
	}

	id := a.execute("print('k1-secret-output')", false)
	requestDone(a, id)
	// Once a has its reply, anything misrouted is already queued ahead of
	// what b and other receive next.
	seenB := b.until(10*time.Second, func(m wsMsg) bool { return m.ParentHeader.MsgID == id && m.state() == "idle" })
	seenB = append(seenB, requestDone(b, b.execute("'own request'", false))...)
	seenOther := requestDone(other, other.execute("'probe'", false))
	stream := false
	for _, m := range seenB {
		stream = stream || strings.Contains(m.text(t), "k1-secret-output")
		if m.ParentHeader.MsgID == id && m.Channel != "iopub" {
			t.Errorf("the second session got %s %s of another connection's request", m.Channel, m.Header.MsgType)
		}
	}
	if !stream {
		t.Errorf("the second session on the kernel did not get the kernel's iopub")
	}
	for _, m := range seenOther {
		if m.ParentHeader.MsgID == id || strings.Contains(m.text(t), "k1-secret-output") {
			t.Errorf("a client of another kernel got %s %s of kernel 1", m.Channel, m.Header.MsgType)
		}
	}

	t.Run("reused msg_id", func(t *testing.T) {
		id := a.execute("import time; time.sleep(1); 'a-result'", false)
		a.until(10*time.Second, func(m wsMsg) bool { return m.Header.MsgType == jupyter.ExecuteInput && m.ParentHeader.MsgID == id })
		// b sends a request under a's msg_id while a's is pending.
		if err := b.conn.WriteMessage(websocket.TextMessage, b4ExecuteFrame("shell", "session-b", id, "'b-result'")); err != nil {
			t.Fatal(err)
		}
		deadline := time.NewTimer(6 * time.Second)
		defer deadline.Stop()
		for {
			select {
			case m := <-a.msgs:
				if m.Channel == "shell" && m.ParentHeader.MsgID == id {
					return
				}
			case <-deadline.C:
				t.Fatalf("a's request never got its reply: another connection that reused its msg_id took it")
			}
		}
	})
}

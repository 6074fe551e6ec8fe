package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/websocket"

	"kernelgate/internal/testkernels"
	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
	"kernelgate/provision/local"
	"kernelgate/runs"
	"kernelgate/sessions"
)

const testToken = "test-token-123"

type testGateway struct {
	t     *testing.T
	url   string
	token string
	mgr   *sessions.Manager
	srv   *Server
}

type gwOption func(*sessions.Config, *Config)

// newGateway serves a gateway over the real kernelspecs on a test server.
func newGateway(t *testing.T, opts ...gwOption) *testGateway {
	t.Helper()
	return newGatewayWithDirs(t, nil, opts...)
}

// runtimeDir is a kernels' runtime directory that a sandboxed kernel's
// unprivileged user can reach (t.TempDir's parent is private to root).
func runtimeDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}

// newGatewayWithDirs searches dirs for kernelspecs before the real ones.
func newGatewayWithDirs(t *testing.T, dirs []string, opts ...gwOption) *testGateway {
	t.Helper()
	specs := kernelspecs.Load(append(dirs, testkernels.Dir(t)))
	metrics := NewMetrics()
	mcfg := sessions.Config{Observer: metrics}
	gcfg := Config{Token: testToken, Metrics: metrics}
	for _, o := range opts {
		o(&mcfg, &gcfg)
	}
	mgr := sessions.New(mcfg, specs, &local.Provisioner{RuntimeDir: runtimeDir(t)}, gcfg.testLogger)
	srv := New(gcfg, mgr, gcfg.testLogger)
	hs := httptest.NewServer(srv)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		hs.Close()
		mgr.Close(ctx)
	})
	return &testGateway{t: t, url: hs.URL, token: gcfg.Token, mgr: mgr, srv: srv}
}

// do sends a request with the gateway's token and returns status and body.
func (g *testGateway) do(method, path string, body any) (int, []byte) {
	g.t.Helper()
	return g.doWith(method, path, body, map[string]string{"Authorization": "token " + g.token})
}

func (g *testGateway) doWith(method, path string, body any, headers map[string]string) (int, []byte) {
	g.t.Helper()
	status, out, err := g.send(method, path, body, headers)
	if err != nil {
		g.t.Fatal(err)
	}
	return status, out
}

// send is doWith without failing the test, for goroutines other than the
// test's own (which may not call t.Fatal).
func (g *testGateway) send(method, path string, body any, headers map[string]string) (int, []byte, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		js, _ := json.Marshal(b)
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequest(method, g.url+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	// Read into a buffer of the body's size: a test that measures the
	// gateway's memory runs this client in the same process.
	out := bytes.NewBuffer(make([]byte, 0, max(resp.ContentLength, 0)+bytes.MinRead))
	_, err = out.ReadFrom(resp.Body)
	return resp.StatusCode, out.Bytes(), err
}

// auth is the header of the gateway's token.
func (g *testGateway) auth() map[string]string {
	return map[string]string{"Authorization": "token " + g.token}
}

// decode unmarshals body into v or fails the test.
func decode[T any](t *testing.T, body []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("decoding %s: %v", body, err)
	}
	return v
}

// startKernel starts a kernel through the REST API.
func (g *testGateway) startKernel(name string) sessions.KernelModel {
	g.t.Helper()
	status, body := g.do("POST", "/api/kernels", map[string]any{"name": name})
	if status != http.StatusCreated {
		g.t.Fatalf("POST /api/kernels: %d %s", status, body)
	}
	return decode[sessions.KernelModel](g.t, body)
}

// wsClient is a test client of the kernel websocket.
type wsClient struct {
	t       *testing.T
	conn    *websocket.Conn
	session string
	v1      bool
	msgs    chan wsMsg
}

// wsMsg is a received message in a convenient shape.
type wsMsg struct {
	Channel      string          `json:"channel"`
	Header       jupyter.Header  `json:"header"`
	ParentHeader jupyter.Header  `json:"parent_header"`
	Content      json.RawMessage `json:"content"`
	Buffers      [][]byte        `json:"-"`
}

func (m wsMsg) text(t *testing.T) string {
	var c struct {
		Data map[string]string `json:"data"`
		Text string            `json:"text"`
	}
	json.Unmarshal(m.Content, &c)
	if c.Text != "" {
		return c.Text
	}
	return c.Data["text/plain"]
}

func (m wsMsg) state() string {
	var c struct {
		State string `json:"execution_state"`
	}
	json.Unmarshal(m.Content, &c)
	return c.State
}

// dialURL opens the kernel websocket with a raw query string.
func (g *testGateway) dialURL(kernelID, query string, header http.Header) (*websocket.Conn, *http.Response, error) {
	u := "ws" + strings.TrimPrefix(g.url, "http") + "/api/kernels/" + kernelID + "/channels" + query
	return websocket.DefaultDialer.Dial(u, header)
}

func decodeInto(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
}

// dial opens the kernel websocket; v1 offers the v1 subprotocol.
func (g *testGateway) dial(kernelID, session string, v1 bool, header http.Header) (*wsClient, *http.Response, error) {
	u := "ws" + strings.TrimPrefix(g.url, "http") + "/api/kernels/" + kernelID + "/channels"
	if session != "" {
		u += "?session_id=" + session
	}
	if header == nil {
		header = http.Header{"Authorization": {"token " + g.token}}
	}
	d := websocket.Dialer{}
	if v1 {
		d.Subprotocols = []string{v1Protocol}
	}
	conn, resp, err := d.Dial(u, header)
	if err != nil {
		return nil, resp, err
	}
	c := &wsClient{t: g.t, conn: conn, session: session, v1: conn.Subprotocol() == v1Protocol, msgs: make(chan wsMsg, 100000)}
	go c.read()
	g.t.Cleanup(func() { conn.Close() })
	return c, resp, nil
}

func (g *testGateway) mustDial(kernelID string, v1 bool) *wsClient {
	g.t.Helper()
	c, resp, err := g.dial(kernelID, uuid.NewString(), v1, nil)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		g.t.Fatalf("dial: %v (status %d)", err, status)
	}
	return c
}

func (c *wsClient) read() {
	defer close(c.msgs)
	for {
		mt, data, err := c.conn.ReadMessage()
		if err != nil {
			return
		}
		var ch string
		var m *sessions.Message
		switch {
		case c.v1:
			ch, m, err = decodeV1(data)
		case mt == websocket.TextMessage:
			ch, m, err = decodeLegacyText(data)
		default:
			ch, m, err = decodeLegacyBinary(data)
		}
		if err != nil {
			c.t.Errorf("undecodable frame from the gateway: %v", err)
			return
		}
		var w wsMsg
		w.Channel = ch
		json.Unmarshal(m.RawHeader, &w.Header)
		json.Unmarshal(m.RawParent, &w.ParentHeader)
		w.Content = m.RawContent
		w.Buffers = m.Buffers
		c.msgs <- w
	}
}

// send sends a request on channel and returns its msg_id.
func (c *wsClient) send(channel string, typ jupyter.MsgType, content any, parent *jupyter.Header) string {
	c.t.Helper()
	m, err := jupyter.NewMessage(c.session, typ, content, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	if parent != nil {
		m.RawParent, _ = json.Marshal(parent)
	}
	var mt int
	var data []byte
	if c.v1 {
		var b bytes.Buffer
		writeV1(&b, channel, m)
		mt, data = websocket.BinaryMessage, b.Bytes()
	} else {
		mt, data = websocket.TextMessage, appendLegacyJSON(nil, channel, m, true)
	}
	if err := c.conn.WriteMessage(mt, data); err != nil {
		c.t.Fatal(err)
	}
	return m.Header.MsgID
}

func (c *wsClient) execute(code string, allowStdin bool) string {
	c.t.Helper()
	content := jupyter.NewExecute(code)
	content.AllowStdin = allowStdin
	return c.send("shell", jupyter.ExecuteRequest, content, nil)
}

// until returns the messages received up to and including the first that
// satisfies stop, failing the test after d.
func (c *wsClient) until(d time.Duration, stop func(wsMsg) bool) []wsMsg {
	c.t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	var got []wsMsg
	for {
		select {
		case m, ok := <-c.msgs:
			if !ok {
				c.t.Fatalf("websocket closed while waiting; got %d messages", len(got))
			}
			got = append(got, m)
			if stop(m) {
				return got
			}
		case <-deadline.C:
			c.t.Fatalf("no awaited message within %v; got %s", d, summary(got))
		}
	}
}

// untilDone returns the messages received up to the end of request id: its
// reply and its idle status, which come on two channels in either order
// (output on iopub can follow the reply on shell).
func (c *wsClient) untilDone(d time.Duration, id string) []wsMsg {
	c.t.Helper()
	reply, idle := false, false
	return c.until(d, func(m wsMsg) bool {
		if m.ParentHeader.MsgID == id {
			reply = reply || m.Header.MsgType == jupyter.ExecuteReply
			idle = idle || m.Header.MsgType == jupyter.StatusMsg && m.state() == string(jupyter.StateIdle)
		}
		return reply && idle
	})
}

func summary(ms []wsMsg) string {
	var parts []string
	for _, m := range ms {
		parts = append(parts, m.Channel+":"+string(m.Header.MsgType)+":"+m.state())
	}
	return strings.Join(parts, " ")
}

// run executes code and returns its messages until both the reply and
// the idle status have arrived.
func (c *wsClient) run(code string) (reply wsMsg, iopub []wsMsg) {
	c.t.Helper()
	id := c.execute(code, false)
	gotReply, gotIdle := false, false
	c.until(30*time.Second, func(m wsMsg) bool {
		if m.ParentHeader.MsgID != id {
			return false
		}
		switch {
		case m.Channel == "shell" && m.Header.MsgType == jupyter.ExecuteReply:
			reply, gotReply = m, true
		case m.Channel == "iopub":
			iopub = append(iopub, m)
			gotIdle = gotIdle || m.state() == "idle"
		}
		return gotReply && gotIdle
	})
	return reply, iopub
}

func resultText(t *testing.T, iopub []wsMsg) string {
	for _, m := range iopub {
		if m.Header.MsgType == jupyter.ExecuteResult {
			return stripANSI(m.text(t))
		}
	}
	return ""
}

// stripANSI is the product's own: the Execution's text mirror uses it.
func stripANSI(s string) string { return runs.StripANSI(s) }

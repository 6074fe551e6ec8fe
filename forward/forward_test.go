package forward

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"kernelgate/internal/leakcheck"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"kernelgate/internal/rawio"
)

// front is a replica that forwards every request to target, served over
// the gateway's connection wrappers; it answers 599 when the owner could
// not be reached.
func front(t *testing.T, target string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := New(mustSecret(t, testSecret), nil)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := p.Forward(w, r, u, []byte("alice")); err != nil {
			if !errors.Is(err, ErrUnreachable) {
				t.Errorf("Forward: %v, want ErrUnreachable", err)
			}
			http.Error(w, err.Error(), 599)
		}
	})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(rawio.Listener{Listener: l}) }()
	t.Cleanup(func() {
		srv.Close()
		p.Close()
		<-done
	})
	return p, "http://" + l.Addr().String()
}

// noLeaks checks, at the end of the test, that the goroutines and files
// are back to what they were.
func noLeaks(t *testing.T) {
	t.Helper()
	before := leakcheck.Snapshot(t)
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections()
		leakcheck.Check(t, before)
	})
}

// TestForwardSignsAndStripsCredentials: the owner gets the principal,
// signed, and never the caller's token; hop-by-hop headers stay behind.
func TestForwardSignsAndStripsCredentials(t *testing.T) {
	noLeaks(t)
	got := make(chan *http.Request, 1)
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r
		w.Header().Set("X-Answer", "yes")
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, "from the owner")
	}))
	defer owner.Close()
	_, fr := front(t, owner.URL)

	req, _ := http.NewRequest("GET", fr+"/api/kernels/k1/channels?session_id=s&token=user-secret", nil)
	req.Header.Set("Authorization", "Bearer user-secret")
	req.Header.Set("Connection", "X-Hop")
	req.Header.Set("X-Hop", "hop")
	req.Header.Set("X-Forwarded-For", "10.9.9.9")
	req.Header.Set(Header, "t=1;p=Zm9yZ2Vk;s=x")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTeapot || string(body) != "from the owner" || resp.Header.Get("X-Answer") != "yes" {
		t.Fatalf("answer: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	r := <-got
	if r.Header.Get("Authorization") != "" || strings.Contains(r.RequestURI, "user-secret") {
		t.Errorf("the owner got the caller's token: %q %q", r.Header.Get("Authorization"), r.RequestURI)
	}
	if r.URL.Query().Get("session_id") != "s" {
		t.Errorf("query lost: %q", r.RequestURI)
	}
	if r.Header.Get("X-Hop") != "" {
		t.Errorf("a hop-by-hop header went through: %v", r.Header)
	}
	if xff := r.Header.Get("X-Forwarded-For"); xff != "10.9.9.9, 127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q", xff)
	}
	if r.Host != strings.TrimPrefix(fr, "http://") {
		t.Errorf("Host = %q, want the one the client named", r.Host)
	}
	p, err := mustSecret(t, testSecret).Verify(r, time.Now())
	if err != nil || string(p) != "alice" {
		t.Fatalf("the owner's check of the signature: %q, %v", p, err)
	}
}

// TestForwardStreamsRequestBody: the owner reads the first part of a body
// before the client has sent the rest (nothing is buffered whole).
func TestForwardStreamsRequestBody(t *testing.T) {
	noLeaks(t)
	const first, rest = 64 << 10, 1 << 20
	halfway := make(chan struct{})
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Half of the first part is enough: the rest of it may wait in
		// the buffers on the way.
		n, err := io.ReadFull(r.Body, make([]byte, first/2))
		if err != nil {
			t.Error(err)
			return
		}
		close(halfway)
		m, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "got %d", int64(n)+m)
	}))
	defer owner.Close()
	_, fr := front(t, owner.URL)

	pr, pw := io.Pipe()
	defer pw.Close() // a failed test lets the owner's handler end
	req, _ := http.NewRequest("PUT", fr+"/api/contexts/c/files/big", pr)
	resp := make(chan *http.Response, 1)
	go func() {
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
		}
		resp <- r
	}()
	go pw.Write(make([]byte, first))
	select {
	case <-halfway:
	case <-time.After(10 * time.Second):
		t.Fatal("the owner got nothing before the body ended: the body was buffered")
	}
	pw.Write(make([]byte, rest))
	pw.Close()
	r := <-resp
	if r == nil {
		return
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if want := fmt.Sprintf("got %d", first+rest); string(body) != want {
		t.Fatalf("answer %q, want %q", body, want)
	}
}

// TestForwardFlushesEachEvent: an SSE event reaches the client while the
// owner waits for the client to have seen it.
func TestForwardFlushesEachEvent(t *testing.T) {
	noLeaks(t)
	seen := make(chan struct{})
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", r.Header.Get("Accept"))
		for i, ev := range []string{"one", "two", "three"} {
			if i > 0 {
				select {
				case <-seen:
				case <-time.After(10 * time.Second):
					return
				}
			}
			io.WriteString(w, "data: "+ev+"\n\n")
			http.NewResponseController(w).Flush()
		}
	}))
	defer owner.Close()
	_, fr := front(t, owner.URL)
	for _, accept := range []string{"text/event-stream", "application/x-ndjson"} {
		req, _ := http.NewRequest("GET", fr+"/api/runs/r1/events", nil)
		req.Header.Set("Accept", accept)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		var got []string
		for sc.Scan() {
			if line := sc.Text(); line != "" {
				got = append(got, line)
				if len(got) < 3 {
					seen <- struct{}{}
				}
			}
		}
		resp.Body.Close()
		if strings.Join(got, ",") != "data: one,data: two,data: three" {
			t.Fatalf("%s: events %q", accept, got)
		}
	}
}

// TestForwardUnreachableOwner: nothing is written, the caller answers.
func TestForwardUnreachableOwner(t *testing.T) {
	noLeaks(t)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + l.Addr().String()
	l.Close()
	_, fr := front(t, dead)
	resp, err := http.Post(fr+"/api/execute", "application/json", strings.NewReader(`{"code":"1"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 599 || !strings.Contains(string(body), "could not be reached") {
		t.Fatalf("answer %d %q", resp.StatusCode, body)
	}
}

// TestForwardOwnerDiesMidStream: the client's stream ends with an error
// (the connection is cut, not ended cleanly) instead of hanging.
func TestForwardOwnerDiesMidStream(t *testing.T) {
	noLeaks(t)
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"seq":1,"type":"start"}`+"\n")
		http.NewResponseController(w).Flush()
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			c.Close() // the owner dies
		}
	}))
	defer owner.Close()
	_, fr := front(t, owner.URL)
	resp, err := http.Get(fr + "/api/runs/r1/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); !strings.Contains(line, `"start"`) {
		t.Fatalf("first event %q", line)
	}
	done := make(chan error, 1)
	go func() { _, err := io.ReadAll(br); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the stream ended cleanly: the client cannot tell it was cut")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client's stream hangs after its owner died")
	}
}

var upgrader = websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}

// TestForwardWebsocket: an upgrade is relayed both ways, through the
// gateway's connection wrappers; when the owner dies the client's
// connection ends; Close ends relayed connections.
func TestForwardWebsocket(t *testing.T) {
	noLeaks(t)
	ownerConns := make(chan *websocket.Conn, 2)
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := upgrader.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		ownerConns <- c
		for {
			mt, b, err := c.ReadMessage()
			if err != nil {
				return
			}
			c.WriteMessage(mt, append([]byte("echo "), b...))
		}
	}))
	defer owner.Close()
	p, fr := front(t, owner.URL)
	dial := func() *websocket.Conn {
		c, resp, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(fr, "http")+"/api/kernels/k/channels", nil)
		if err != nil {
			t.Fatalf("dial: %v %v", err, resp)
		}
		return c
	}
	c := dial()
	defer c.Close()
	for _, mt := range []int{websocket.TextMessage, websocket.BinaryMessage} {
		c.WriteMessage(mt, []byte("hi"))
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		gotType, b, err := c.ReadMessage()
		if err != nil || gotType != mt || string(b) != "echo hi" {
			t.Fatalf("read %d %q %v", gotType, b, err)
		}
	}
	// The owner dies: its side is cut without a close frame.
	(<-ownerConns).NetConn().Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := c.ReadMessage(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("after the owner died the client read %v", err)
	}

	// Close ends the connections still relayed.
	c2 := dial()
	defer c2.Close()
	<-ownerConns
	p.Close()
	c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := c2.ReadMessage(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("after Close the client read %v", err)
	}
}

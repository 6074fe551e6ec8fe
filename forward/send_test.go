package forward

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestSendNotSent: a forward to an owner whose port is closed says that
// nothing was sent (ErrNotSent, within ErrUnreachable): the caller may
// send it again elsewhere, whatever its method. Forward says so too.
func TestSendNotSent(t *testing.T) {
	noLeaks(t)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	dead, _ := url.Parse("http://" + l.Addr().String())
	l.Close()
	p := New(mustSecret(t, testSecret), nil)
	defer p.Close()
	in := httptest.NewRequest("POST", "/api/execute", strings.NewReader(`{"code":"1"}`))
	_, err := p.Send(context.Background(), dead, in, []byte(`{"code":"1"}`), []byte("alice"))
	if !errors.Is(err, ErrUnreachable) || !errors.Is(err, ErrNotSent) {
		t.Errorf("Send to a closed port: %v, want ErrUnreachable and ErrNotSent", err)
	}
	err = p.Forward(httptest.NewRecorder(), httptest.NewRequest("GET", "/api/contexts/c", nil), dead, []byte("alice"))
	if !errors.Is(err, ErrUnreachable) || !errors.Is(err, ErrNotSent) {
		t.Errorf("Forward to a closed port: %v, want ErrUnreachable and ErrNotSent", err)
	}
}

// TestSendSignsAndStripsCredentials: Send gives the owner the body whole,
// the principal signed, and never the caller's token or hop-by-hop
// headers; the owner's answer is the caller's to read.
func TestSendSignsAndStripsCredentials(t *testing.T) {
	noLeaks(t)
	got := make(chan *http.Request, 1)
	bodies := make(chan string, 1)
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r
		bodies <- string(b)
		io.WriteString(w, "from the owner")
	}))
	defer owner.Close()
	target, _ := url.Parse(owner.URL)
	p := New(mustSecret(t, testSecret), nil)
	defer p.Close()
	in := httptest.NewRequest("POST", "/api/execute?token=user-secret&x=1", nil)
	in.Header.Set("Authorization", "Bearer user-secret")
	in.Header.Set("Cookie", "s=user-secret")
	in.Header.Set("Connection", "keep-alive")
	in.Header.Set(Header, "t=1;p=Zm9yZ2Vk;s=x")
	in.Header.Set("Accept", "application/x-ndjson")
	resp, err := p.Send(context.Background(), target, in, []byte(`{"code":"1"}`), []byte("alice"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "from the owner" {
		t.Errorf("answer %q", b)
	}
	r := <-got
	if body := <-bodies; body != `{"code":"1"}` {
		t.Errorf("the owner got body %q", body)
	}
	if r.Header.Get("Authorization") != "" || r.Header.Get("Cookie") != "" || strings.Contains(r.RequestURI, "user-secret") {
		t.Errorf("the owner got the caller's credentials: %v %q", r.Header, r.RequestURI)
	}
	if r.URL.Query().Get("x") != "1" || r.Header.Get("Accept") != "application/x-ndjson" {
		t.Errorf("the request's query or Accept lost: %q %v", r.RequestURI, r.Header)
	}
	if pr, err := mustSecret(t, testSecret).Verify(r, time.Now()); err != nil || string(pr) != "alice" {
		t.Errorf("the owner's check of the signature: %q, %v", pr, err)
	}
}

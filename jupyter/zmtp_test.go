package jupyter

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// peerSays serves one connection that sends b and then reads whatever
// comes, and returns its address.
func peerSays(t *testing.T, b []byte) string {
	t.Helper()
	return peerSaysThen(t, b, false)
}

// peerSaysThen is peerSays whose peer, if hangUp, ends the connection
// once it has said b (and reads on until the dialer closes, so that the
// dialer sees the end and not a reset).
func peerSaysThen(t *testing.T, b []byte, hangUp bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write(b)
		if hangUp {
			c.(*net.TCPConn).CloseWrite()
		}
		io.Copy(io.Discard, c)
	}()
	return "tcp://" + ln.Addr().String()
}

// command is a ZMTP command frame of the given body.
func command(body []byte) []byte {
	return append(appendFrameHeader(nil, flagCommand, len(body)), body...)
}

// What a peer says in the handshake decides whether the socket opens; the
// peer's READY passes the same size limits as every message.
func TestHandshake(t *testing.T) {
	mechanism := func(name string) []byte {
		g := bytes.Clone(greeting)
		copy(g[12:32], make([]byte, 20))
		copy(g[12:32], name)
		return g
	}
	huge := []byte{flagCommand | flagLong, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	cases := []struct {
		name   string
		peer   []byte
		want   error
		says   string
		hangUp bool
	}{
		{"router", append(bytes.Clone(greeting), command(appendReady(nil, "ROUTER", ""))...), nil, "", false},
		{"pub for a dealer", append(bytes.Clone(greeting), command(appendReady(nil, "PUB", ""))...), ErrHandshake, `"PUB"`, false},
		{"http", append([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"), make([]byte, 64)...), ErrHandshake, "does not speak ZMTP", false},
		{"plain mechanism", mechanism("PLAIN"), ErrHandshake, `"PLAIN"`, false},
		{"error command", append(bytes.Clone(greeting), command([]byte("\x05ERROR\x0bgo away now"))...), ErrHandshake, "go away now", false},
		{"message before ready", append(bytes.Clone(greeting), 0, 1, 'x'), ErrHandshake, "before the peer's READY", false},
		{"huge ready", append(bytes.Clone(greeting), huge...), ErrMessageTooLarge, "", false},
		// What a socket of another type, or a TLS server, does.
		{name: "hangs up at once", want: ErrHandshake, says: "ended the connection", hangUp: true},
		{name: "hangs up after its greeting", peer: bytes.Clone(greeting), want: ErrHandshake, says: "ended the connection", hangUp: true},
		{name: "hangs up in its greeting", peer: greeting[:20], want: ErrHandshake, says: "ended the connection", hangUp: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := dialSocket(ctx, peerSaysThen(t, tc.peer, tc.hangUp), sockDealer, "id", readLimits{})
			if s != nil {
				s.close()
			}
			if tc.want == nil {
				if err != nil {
					t.Fatalf("handshake with a ROUTER: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("err = %v, want %v saying %s", err, tc.want, tc.says)
			}
		})
	}
}

func TestParseReady(t *testing.T) {
	props, err := parseReady(appendReady(nil, sockDealer, "abc"))
	if err != nil || props["socket-type"] != "DEALER" || props["identity"] != "abc" {
		t.Fatalf("props %v, err %v", props, err)
	}
	full := appendReady(nil, sockDealer, "abc")
	for n := 0; n < len(full); n++ {
		// Cut anywhere inside a property, a READY is refused, never read
		// past its end.
		if _, err := parseReady(full[:n]); n > 6 && n != 6+1+11+4+6 && err == nil {
			t.Errorf("READY cut to %d bytes accepted", n)
		}
	}
}

// A kernel's READY is untrusted input: parseReady never panics, and reads
// back every READY appendReady writes.
func FuzzParseReady(f *testing.F) {
	f.Add(appendReady(nil, sockDealer, "id"))
	f.Add([]byte("\x05ERROR\x03bad"))
	f.Add([]byte("\x05READY\x0bSocket-Type\xff\xff\xff\xffROUTER"))
	// Names of 255 bytes: a length byte plus one must not wrap around.
	f.Add(append([]byte{255}, bytes.Repeat([]byte("R"), 255)...))
	f.Add(append([]byte("\x05ERROR\xff"), bytes.Repeat([]byte("e"), 255)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		parseReady(b)
		if len(b) > 255 {
			return
		}
		props, err := parseReady(appendReady(nil, socketType(b), string(b)))
		if err != nil || props["socket-type"] != string(b) || props["identity"] != string(b) {
			t.Fatalf("READY of %q read back as %v, %v", b, props, err)
		}
	})
}

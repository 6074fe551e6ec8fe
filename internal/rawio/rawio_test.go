//go:build linux

package rawio

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// pair returns a wrapped connection of network and its plain peer.
func pair(t *testing.T, network string) (*Conn, net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(t.TempDir(), "s")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := Listener{ln}.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	peer, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := <-accepted
	rc, ok := c.(*Conn)
	if !ok {
		t.Fatalf("accepted %T, want *rawio.Conn", c)
	}
	t.Cleanup(func() { rc.Close(); peer.Close() })
	return rc, peer
}

func payload(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(1, uint64(n)))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// Bytes pass whole both ways, including writes far larger than the
// socket's buffer, which wait for the peer to read.
func TestReadWrite(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			c, peer := pair(t, network)
			big := payload(16 << 20)
			got := make(chan []byte, 1)
			go func() {
				b, _ := io.ReadAll(io.LimitReader(peer, int64(len(big))))
				got <- b
			}()
			n, err := c.Write(big)
			if err != nil || n != len(big) {
				t.Fatalf("Write = %d, %v", n, err)
			}
			if !bytes.Equal(<-got, big) {
				t.Fatal("peer read other bytes than written")
			}

			go peer.Write(big)
			back := make([]byte, len(big))
			if _, err := io.ReadFull(c, back); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back, big) {
				t.Fatal("read other bytes than the peer wrote")
			}
			if n, err := c.Read(nil); n != 0 || err != nil {
				t.Fatalf("empty Read = %d, %v", n, err)
			}
		})
	}
}

// WriteBuffers writes the concatenation of its buffers (empty ones, more
// than one writev's worth, and more than the socket holds) and consumes
// them.
func TestWriteBuffers(t *testing.T) {
	c, peer := pair(t, "tcp")
	var bufs net.Buffers
	var want []byte
	for i := range 3000 {
		b := payload(i % 700 * 17)
		bufs = append(bufs, b, nil)
		want = append(want, b...)
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(peer, int64(len(want))))
		got <- b
	}()
	n, err := c.WriteBuffers(&bufs)
	if err != nil || n != int64(len(want)) {
		t.Fatalf("WriteBuffers = %d, %v; want %d", n, err, len(want))
	}
	if len(bufs) != 0 {
		t.Fatalf("%d buffers left", len(bufs))
	}
	if !bytes.Equal(<-got, want) {
		t.Fatal("peer read other bytes than written")
	}
}

// Deadlines, closing and the peer's end are reported as for a plain
// connection.
func TestErrors(t *testing.T) {
	c, peer := pair(t, "tcp")

	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := c.Read(make([]byte, 10))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past the deadline: %v", err)
	}
	c.SetReadDeadline(time.Time{})

	// CloseWrite: the peer sees the end, and the connection still reads.
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(peer); err != nil || len(b) != 0 {
		t.Fatalf("peer after CloseWrite: %q, %v", b, err)
	}
	peer.Write([]byte("late"))
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "late" {
		t.Fatalf("read after CloseWrite: %q, %v", b, err)
	}
	peer.Close()
	if _, err := c.Read(b); err != io.EOF {
		t.Fatalf("read after the peer closed: %v, want EOF", err)
	}

	c2, _ := pair(t, "tcp")
	done := make(chan error, 1)
	go func() {
		_, err := c2.Read(make([]byte, 10))
		done <- err
	}()
	c2.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read on a closed connection: %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end a waiting Read")
	}
	if _, err := c2.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write on a closed connection: %v", err)
	}
}

// Only sockets of package net are wrapped.
func TestWrap(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if Wrap(a) != a || WrapConn(a) != nil {
		t.Fatal("a pipe was wrapped")
	}
}

package jupyter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

var quietLog = log.New(io.Discard, "", 0)

// A kernel's ROUTER receives what a socket sends whole and in order, with
// frames short and long, from several senders at once; what it sends back
// arrives as sent.
func TestSocketFramesToAndFromRouter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	router := zmq4.NewRouter(ctx, zmq4.WithLogger(quietLog))
	defer router.Close()
	if err := router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	s, err := dialSocket(ctx, "tcp://"+router.Addr().String(), sockDealer, "client-1", readLimits{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()

	sizes := []int{0, 1, 255, 256, 70_000}
	message := func(sender, i int) [][]byte {
		var frames [][]byte
		for _, n := range sizes {
			frames = append(frames, bytes.Repeat([]byte{byte('a' + sender)}, n))
		}
		return append(frames, fmt.Appendf(nil, "%d/%d", sender, i))
	}
	const senders, each = 4, 50
	var wg sync.WaitGroup
	for w := range senders {
		wg.Go(func() {
			for i := range each {
				if err := s.send(message(w, i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	next := make([]int, senders)
	for range senders * each {
		m, err := router.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if string(m.Frames[0]) != "client-1" {
			t.Fatalf("identity %q", m.Frames[0])
		}
		got := m.Frames[1:]
		var w, i int
		if _, err := fmt.Sscanf(string(got[len(got)-1]), "%d/%d", &w, &i); err != nil || w >= senders {
			t.Fatalf("last frame %q", got[len(got)-1])
		}
		if i != next[w] {
			t.Fatalf("sender %d: message %d arrived before %d", w, i, next[w])
		}
		next[w]++
		want := message(w, i)
		if len(got) != len(want) {
			t.Fatalf("%d frames, want %d", len(got), len(want))
		}
		for k := range want {
			if !bytes.Equal(got[k], want[k]) {
				t.Fatalf("frame %d of %d/%d differs (%d bytes, want %d)", k, w, i, len(got[k]), len(want[k]))
			}
		}
	}
	wg.Wait()

	back := [][]byte{[]byte("reply"), bytes.Repeat([]byte{'z'}, 300), {}}
	if err := router.SendMulti(zmq4.NewMsgFrom(append([][]byte{[]byte("client-1")}, back...)...)); err != nil {
		t.Fatal(err)
	}
	got, err := s.recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(back) || !bytes.Equal(got[0], back[0]) || !bytes.Equal(got[1], back[1]) || len(got[2]) != 0 {
		t.Fatalf("received %q", got)
	}

	s.close()
	if _, err := s.recv(); err == nil {
		t.Fatal("recv on a closed socket succeeded")
	}
}

// A peer with ZMTP heartbeats on gets a PONG carrying its context, and the
// message after the PING is received as usual.
func TestSocketAnswersPing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := make(chan *zmq4.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(peer)
			return
		}
		zc, err := zmq4.Open(c, null.Security(), zmq4.Router, zmq4.SocketIdentity(""), true, nil)
		if err != nil {
			c.Close()
			close(peer)
			return
		}
		peer <- zc
	}()
	s, err := dialSocket(ctx, "tcp://"+ln.Addr().String(), sockDealer, "x", readLimits{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	zc := <-peer
	if zc == nil {
		t.Fatal("peer handshake failed")
	}
	defer zc.Close()

	received := make(chan [][]byte, 1)
	go func() {
		m, err := s.recv()
		if err != nil {
			t.Error(err)
		}
		received <- m
	}()
	if err := zc.SendCmd(zmq4.CmdPing, []byte("\x00\x0actx-42")); err != nil {
		t.Fatal(err)
	}
	cmd, err := zc.RecvCmd()
	if err != nil {
		t.Fatal(err)
	}
	if cmd.Name != zmq4.CmdPong || string(cmd.Body) != "ctx-42" {
		t.Fatalf("answer %s %q, want PONG ctx-42", cmd.Name, cmd.Body)
	}
	if err := zc.SendMsg(zmq4.NewMsgFrom([]byte("after"), []byte("ping"))); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-received:
		if len(m) != 2 || string(m[0]) != "after" || string(m[1]) != "ping" {
			t.Fatalf("received %q", m)
		}
	case <-ctx.Done():
		t.Fatal("no message after the PING")
	}
}

// A dial waits for the kernel to bind its port, and gives up when ctx
// ends; a peer of the wrong socket type is refused.
func TestDialSocket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub := zmq4.NewPub(ctx, zmq4.WithLogger(quietLog))
	defer pub.Close()
	// A free port is chosen, dialed, then bound; another process may take
	// it in between: then the test tries another.
	var addr string
	for attempt := 1; ; attempt++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr = ln.Addr().String()
		ln.Close()
		dctx, dcancel := context.WithCancel(ctx)
		dialed := make(chan error, 1)
		go func() {
			s, err := dialSocket(dctx, "tcp://"+addr, sockSub, "", readLimits{})
			if err == nil {
				s.close()
			}
			dialed <- err
		}()
		// The dial is retrying: the port is bound only now.
		lerr := pub.Listen("tcp://" + addr)
		if lerr != nil {
			dcancel()
			<-dialed
			if attempt == 5 {
				t.Fatalf("every port chosen was taken before it was bound: %v", lerr)
			}
			continue
		}
		err = <-dialed
		dcancel()
		if err != nil {
			t.Fatalf("dial after bind: %v", err)
		}
		break
	}

	if _, err := dialSocket(ctx, "tcp://"+addr, sockDealer, "", readLimits{}); err == nil {
		t.Fatal("a DEALER connected to a PUB")
	} else if !errors.Is(err, ErrHandshake) && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("err = %v, want the incompatibility a taken port shows", err)
	}

	short, stop := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer stop()
	if _, err := dialSocket(short, "tcp://127.0.0.1:1", sockDealer, "", readLimits{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's", err)
	}
}

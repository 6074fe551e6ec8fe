package local

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"kernelgate/internal/testkernels"
	"kernelgate/kernelspecs"

	"kernelgate/jupyter"
)

// impostor is what a start meets when another process had one of the
// kernel's ports: sockets that complete the ZMTP handshake, of which one
// then closes its connection (or, with hangUp, ends it during the
// handshake, as a socket of another type or a TLS server does), while
// the kernel process (here, no process) keeps running until it is killed.
type impostor struct {
	ci   jupyter.ConnInfo
	lns  []net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	open []net.Conn
	done chan struct{}
	once sync.Once
}

func newImpostor(t *testing.T, closing jupyter.Channel, hangUp bool) *impostor {
	p := &impostor{done: make(chan struct{}),
		ci: jupyter.ConnInfo{IP: "127.0.0.1", Transport: "tcp", Key: "impostor-key", SignatureScheme: "hmac-sha256"}}
	for _, c := range []struct {
		ch   jupyter.Channel
		port *int
		typ  zmq4.SocketType
	}{
		{jupyter.Shell, &p.ci.ShellPort, zmq4.Router}, {jupyter.IOPub, &p.ci.IOPubPort, zmq4.Pub}, {jupyter.Control, &p.ci.ControlPort, zmq4.Router},
		{jupyter.Stdin, &p.ci.StdinPort, zmq4.Router}, {jupyter.Heartbeat, &p.ci.HBPort, zmq4.Rep},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p.lns = append(p.lns, ln)
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		*c.port, _ = strconv.Atoi(port)
		closes := c.ch == closing
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			if closes && hangUp {
				conn.Write(greeting)
				conn.(*net.TCPConn).CloseWrite()
				io.Copy(io.Discard, conn)
				conn.Close()
				return
			}
			if _, err := zmq4.Open(conn, null.Security(), c.typ, zmq4.SocketIdentity(""), true, nil); err != nil || closes {
				conn.Close()
				return
			}
			p.mu.Lock()
			p.open = append(p.open, conn)
			p.mu.Unlock()
		}()
	}
	return p
}

// greeting is a ZMTP 3.0 greeting for the NULL mechanism.
var greeting = func() []byte {
	g := make([]byte, 64)
	g[0], g[9] = 0xff, 0x7f // signature
	g[10], g[11] = 3, 0     // version
	copy(g[12:32], "NULL")  // mechanism; then as-server 0 and filler
	return g
}()

func (p *impostor) ConnInfo() jupyter.ConnInfo { return p.ci }
func (p *impostor) Interrupt() error           { return nil }
func (p *impostor) Terminate() error           { return nil }
func (p *impostor) Kill() error {
	p.once.Do(func() { close(p.done) })
	return nil
}
func (p *impostor) Done() <-chan struct{} { return p.done }
func (p *impostor) ExitStatus() string    { return "signal: killed" }
func (p *impostor) ExitReason() string    { return "" }
func (p *impostor) Output() string        { return "" }
func (p *impostor) Cleanup() error {
	for _, ln := range p.lns {
		ln.Close()
	}
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.open {
		c.Close()
	}
	return nil
}

// impostorFirst gives the first launch an impostor and the next ones to
// real.
type impostorFirst struct {
	t        *testing.T
	closing  jupyter.Channel
	hangUp   bool
	real     jupyter.Provisioner
	mu       sync.Mutex
	launches int
	first    *impostor
}

func (p *impostorFirst) Capabilities(spec *kernelspecs.Spec) jupyter.Capabilities {
	return p.real.Capabilities(spec)
}

// RetryStart is the real provisioner's.
func (p *impostorFirst) RetryStart(spec *kernelspecs.Spec, err error, attempt int) bool {
	return p.real.(jupyter.StartRetrier).RetryStart(spec, err, attempt)
}

func (p *impostorFirst) Launch(ctx context.Context, req jupyter.LaunchRequest) (jupyter.Process, error) {
	p.mu.Lock()
	p.launches++
	n := p.launches
	p.mu.Unlock()
	if n == 1 {
		p.first = newImpostor(p.t, p.closing, p.hangUp)
		return p.first, nil
	}
	return p.real.Launch(ctx, req)
}

// A start whose kernel connection ends while the kernel still runs met
// another process's socket on a port it had picked: kernelgate kills that
// start and starts the kernel again on new ports. A closed shell
// connection shows first as a failed request, a closed iopub connection
// as a reader that lost its peer, a heartbeat port that hangs up in the
// handshake as a failed dial.
func TestStartAgainWhenAConnectionEndsDuringStart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		closing jupyter.Channel
		hangUp  bool
	}{{"shell", jupyter.Shell, false}, {"iopub", jupyter.IOPub, false}, {"hb hangs up in the handshake", jupyter.Heartbeat, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			p := &impostorFirst{t: t, closing: tc.closing, hangUp: tc.hangUp, real: &Provisioner{RuntimeDir: t.TempDir()}}
			k, err := jupyter.Start(ctx, p, jupyter.Config{Spec: testkernels.Spec(t, "python3")})
			if err != nil {
				t.Fatalf("start: %v", err)
			}
			defer k.Shutdown(context.Background())
			if p.launches != 2 {
				t.Fatalf("%d launches, want 2 (the impostor, then the kernel)", p.launches)
			}
			select {
			case <-p.first.Done():
			default:
				t.Fatal("the first start was not killed")
			}
			reply, err := k.Execute(ctx, "1+1", nil)
			if err != nil {
				t.Fatalf("execute on the kernel started again: %v", err)
			}
			var c struct {
				Status string `json:"status"`
			}
			if err := reply.DecodeContent(&c); err != nil || c.Status != "ok" {
				t.Fatalf("reply %s, %v", reply.RawContent, err)
			}
		})
	}
}

// The error of a kernel stopped because a connection ended says so.
func TestDiedErrorOfALostConnection(t *testing.T) {
	err := &jupyter.DiedError{Lost: "shell", During: "start"}
	if got, want := err.Error(), "jupyter: kernel died during start (its shell connection ended while it ran)"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
	if !(&Provisioner{}).RetryStart(nil, err, 1) {
		t.Fatal("a connection lost during a start is not taken for another process's port")
	}
}

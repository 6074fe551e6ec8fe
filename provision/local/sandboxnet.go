package local

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"kernelgate/jupyter"
)

// A kernel in a network namespace of its own can only be reached through
// the file system. Kernels that speak the ipc transport bind their sockets
// in their directory. For the others (Deno's only speaks tcp) netBridge
// serves one unix socket per channel in the gateway-only part of the
// kernel's directory and copies every connection to the kernel's TCP port,
// dialled from a thread that entered the kernel's namespace.

const (
	// bridgeRetry is how often the bridge checks whether the kernel
	// listens yet.
	bridgeRetry = 5 * time.Millisecond
	// bridgeDialTimeout bounds one dial inside the namespace.
	bridgeDialTimeout = time.Second
)

var errBridgeClosed = errors.New("jupyter: sandbox bridge closed")

type netBridge struct {
	ns    *os.File
	dials chan dialReq
	stop  chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	closers map[io.Closer]struct{}

	closeOnce sync.Once
}

type dialReq struct {
	addr string
	res  chan dialRes
}

type dialRes struct {
	c   net.Conn
	err error
}

// startBridge enters the network namespace ns and serves, for every
// channel, gw's ipc endpoint as a copy of kernel's tcp endpoint. It owns
// ns from then on.
func startBridge(ns *os.File, kernel, gw jupyter.ConnInfo) (*netBridge, error) {
	b := &netBridge{
		ns:      ns,
		dials:   make(chan dialReq),
		stop:    make(chan struct{}),
		closers: map[io.Closer]struct{}{},
	}
	ready := make(chan error, 1)
	b.wg.Add(1)
	go b.inNamespace(ready)
	if err := <-ready; err != nil {
		b.Close()
		return nil, err
	}
	for _, c := range []jupyter.Channel{jupyter.Shell, jupyter.IOPub, jupyter.Stdin, jupyter.Control, jupyter.Heartbeat} {
		b.wg.Add(1)
		go b.serve(net.JoinHostPort(kernel.IP, strconv.Itoa(kernel.Port(c))), gw.IP+"-"+strconv.Itoa(gw.Port(c)))
	}
	return b, nil
}

// inNamespace is the one goroutine that dials the kernel. Its thread
// enters the kernel's network namespace for good: the goroutine never
// unlocks it, so the runtime ends the thread when the goroutine returns.
func (b *netBridge) inNamespace(ready chan<- error) {
	defer b.wg.Done()
	runtime.LockOSThread()
	if err := enterNetNS(b.ns); err != nil {
		ready <- err
		return
	}
	ready <- nil
	d := net.Dialer{Timeout: bridgeDialTimeout}
	for {
		select {
		case r := <-b.dials:
			c, err := d.Dial("tcp", r.addr)
			r.res <- dialRes{c, err}
		case <-b.stop:
			return
		}
	}
}

// dial connects to addr inside the kernel's namespace.
func (b *netBridge) dial(addr string) (net.Conn, error) {
	r := dialReq{addr: addr, res: make(chan dialRes, 1)}
	select {
	case b.dials <- r:
	case <-b.stop:
		return nil, errBridgeClosed
	}
	res := <-r.res
	return res.c, res.err
}

// track registers c to be closed by Close; false when already closed.
func (b *netBridge) track(c io.Closer) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		c.Close()
		return false
	}
	b.closers[c] = struct{}{}
	return true
}

func (b *netBridge) untrack(c io.Closer) {
	b.mu.Lock()
	delete(b.closers, c)
	b.mu.Unlock()
	c.Close()
}

// serve waits until the kernel listens on addr, then listens on the unix
// socket path and copies each connection to a connection to addr. Until
// path exists a client's dial fails and is retried, as for a kernel that
// has not bound its ports yet.
func (b *netBridge) serve(addr, path string) {
	defer b.wg.Done()
	var first net.Conn
	t := time.NewTimer(0)
	defer t.Stop()
	for first == nil {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		c, err := b.dial(addr)
		if errors.Is(err, errBridgeClosed) {
			return
		}
		if err != nil {
			t.Reset(bridgeRetry)
			continue
		}
		first = c
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		first.Close()
		return
	}
	if !b.track(l) {
		first.Close()
		return
	}
	for {
		c, err := l.Accept()
		if err != nil {
			if first != nil {
				first.Close()
			}
			return
		}
		inner := first
		first = nil
		if inner == nil {
			if inner, err = b.dial(addr); err != nil {
				c.Close()
				continue
			}
		}
		b.pipe(c, inner)
	}
}

// pipe copies between a and b until either side ends, then closes both.
func (b *netBridge) pipe(x, y net.Conn) {
	if !b.track(x) || !b.track(y) {
		x.Close()
		y.Close()
		return
	}
	var once sync.Once
	end := func() {
		once.Do(func() {
			b.untrack(x)
			b.untrack(y)
		})
	}
	b.wg.Add(2)
	go func() {
		defer b.wg.Done()
		io.Copy(x, y)
		end()
	}()
	go func() {
		defer b.wg.Done()
		io.Copy(y, x)
		end()
	}()
}

// Close stops the bridge, closes every connection and waits for its
// goroutines. It is idempotent.
func (b *netBridge) Close() error {
	if b == nil {
		return nil
	}
	b.closeOnce.Do(func() {
		close(b.stop)
		b.mu.Lock()
		b.closed = true
		for c := range b.closers {
			c.Close()
		}
		b.closers = nil
		b.mu.Unlock()
		b.wg.Wait()
		b.ns.Close()
	})
	return nil
}

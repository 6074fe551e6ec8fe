// Package forward passes a request one replica received to the replica
// that owns what it addresses, and relays the answer: plain bodies
// streamed both ways, streamed answers (NDJSON, SSE) flushed as each
// write arrives, and protocol upgrades (websockets) spliced byte for byte.
//
// The forwarding replica has authenticated the caller; it sends the
// principal it found, signed with the cluster secret (Secret.Sign, the
// Header), never the caller's own credentials, and the receiver trusts
// that principal only when the signature checks (Secret.Verify).
//
// It knows nothing of kernels, routes, principals' contents or the API's
// errors: which replica owns what is the gateway's question, a principal
// is bytes, and a failure is a sentinel the gateway maps to its answer.
package forward

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"
)

// ErrUnreachable: the owner did not answer (refused, reset, or gone
// before its answer began). Nothing was written to the client.
var ErrUnreachable = errors.New("forward: the replica that owns this could not be reached")

// Proxy forwards requests to other replicas. Its zero value is not
// usable: make one with New. Close ends the upgraded connections it
// still relays.
type Proxy struct {
	secret *Secret
	log    *slog.Logger
	rp     *httputil.ReverseProxy
	tr     *http.Transport

	mu     sync.Mutex
	conns  map[net.Conn]struct{} // hijacked client connections being relayed
	closed bool
}

// New makes a Proxy signing with secret. log may be nil.
func New(secret *Secret, log *slog.Logger) *Proxy {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	// Replicas' answers are relayed as they come: never compressed on
	// the way, never waited for.
	tr.DisableCompression = true
	p := &Proxy{secret: secret, log: log, tr: tr, conns: map[net.Conn]struct{}{}}
	p.rp = &httputil.ReverseProxy{
		Rewrite:       p.rewrite,
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler:  p.failed,
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return p
}

// job is one forwarded request's part of the Proxy, in its context.
type job struct {
	target    *url.URL
	principal []byte
	err       error // the owner could not be reached; nothing written
}

type jobKey struct{}

// Forward sends r to the replica at target (its scheme and host; its
// path is ignored: replicas share their base URL) on behalf of principal,
// and writes the answer to w. It returns an error wrapping ErrUnreachable
// when the owner did not answer and nothing was written; otherwise nil,
// the answer relayed (a stream broken off by the owner ends the client's
// connection: http.ErrAbortHandler, as net/http expects).
//
// The caller's credentials (Authorization, the token query parameter) are
// not sent; hop-by-hop headers are dropped; X-Forwarded-For, -Host and
// -Proto are set. r.Body is streamed to the owner as it is read.
func (p *Proxy) Forward(w http.ResponseWriter, r *http.Request, target *url.URL, principal []byte) error {
	j := &job{target: target, principal: principal}
	r = r.WithContext(context.WithValue(r.Context(), jobKey{}, j))
	// The owner's answer is relayed while the body still streams to it
	// (an upload refused early gets its answer at once).
	http.NewResponseController(w).EnableFullDuplex()
	tw := &trackedWriter{ResponseWriter: w, p: p}
	defer tw.done()
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				p.log.Warn("forward: the owner's answer broke off; the client's connection is ended", "owner", target.Host, "path", r.URL.Path)
			}
			panic(v)
		}
	}()
	p.rp.ServeHTTP(tw, r)
	if j.err != nil {
		if notSent(j.err) {
			return fmt.Errorf("%w (%w, %s): %v", ErrUnreachable, ErrNotSent, target.Host, j.err)
		}
		return fmt.Errorf("%w (%s): %v", ErrUnreachable, target.Host, j.err)
	}
	return nil
}

// rewrite makes the outgoing request of a forwarded one.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	j := pr.In.Context().Value(jobKey{}).(*job)
	out := pr.Out
	out.URL.Scheme, out.URL.Host = j.target.Scheme, j.target.Host
	// The owner sees the Host the client named, so that its checks of
	// Origin and Host decide as the first replica's would.
	out.Host = pr.In.Host
	out.Header.Del("Authorization")
	out.Header.Del("Cookie")
	if q := out.URL.Query(); q.Has("token") {
		q.Del("token")
		out.URL.RawQuery = q.Encode()
	}
	out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
	pr.SetXForwarded()
	out.Header.Del(Header)
	p.secret.Sign(out.Header, out.Method, out.URL.RequestURI(), j.principal, time.Now())
}

// failed records that the owner could not be reached; Forward returns it
// for the caller to answer in its own terms.
func (p *Proxy) failed(w http.ResponseWriter, r *http.Request, err error) {
	if j, ok := r.Context().Value(jobKey{}).(*job); ok {
		j.err = err
	}
}

// Close closes idle connections to the owners and the upgraded
// connections still relayed (http.Server.Shutdown does not: they are
// hijacked). Forwards after Close still work, but their upgrades are
// closed at once.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	p.tr.CloseIdleConnections()
}

// track registers a hijacked connection; false once the Proxy is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// trackedWriter is the client's ResponseWriter as the reverse proxy sees
// it: flushes pass through; a hijacked connection is tracked for Close
// until Forward returns, and is closed whole (never half) when the owner
// ends its side, so that a client waiting on a dead owner hears of it.
type trackedWriter struct {
	http.ResponseWriter
	p    *Proxy
	conn net.Conn
}

func (w *trackedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *trackedWriter) Flush() {
	http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *trackedWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	if !w.p.track(c) {
		c.Close()
		return nil, nil, net.ErrClosed
	}
	w.conn = c
	return wholeConn{c}, brw, nil
}

func (w *trackedWriter) done() {
	if w.conn != nil {
		w.p.untrack(w.conn)
	}
}

// wholeConn hides a connection's CloseWrite: the reverse proxy half-closes
// the client's side when the owner's ends, which leaves a client that is
// not reading (a websocket waiting for output) unaware; closed whole, its
// next read fails at once.
type wholeConn struct{ net.Conn }

var _ io.ReadWriteCloser = wholeConn{}

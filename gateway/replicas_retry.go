package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"kernelgate/forward"
)

// Forwards other than runs' (replicas_runs.go), with Leases: the owner is
// watched while its answer has not begun (its lease lapsing or moving
// ends the wait: a frozen owner is not waited on past its lease), and a
// forward that reached no owner is sent again to the next one when that
// is safe: nothing of it was sent (the connection was refused), or it
// repeats harmlessly (GET, HEAD, OPTIONS, DELETE) and its body, if any, is
// at hand. The next owner is the replica that holds the lease next; this
// one when it does (the route's handler answers). Given up after three
// leases and 30 s: 503 UNAVAILABLE with Retry-After.
//
// This is the one retry of forwarding: any forward that failed before
// the owner answered goes through it.

// bodyKey holds a request's whole body when it was read to find what the
// request addresses (ownedInBody): the forward can be sent again.
const bodyKey = "kernelgate.body"

// replayable returns the body to send again, and whether there is one
// at hand (none needed for a request without a body).
func replayable(c echo.Context) ([]byte, bool) {
	if b, ok := c.Get(bodyKey).([]byte); ok {
		return b, true
	}
	r := c.Request()
	return nil, r.ContentLength == 0 && (r.Body == nil || r.Body == http.NoBody)
}

// repeatable methods may be sent again after the owner was lost without
// answering: they change nothing twice.
func repeatable(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodDelete:
		return true
	}
	return false
}

// forwardRetrying forwards c's request to target, the owner of kind id,
// as above; done false: this replica owns it now (the handler answers).
func (s *Server) forwardRetrying(c echo.Context, kind Kind, id string, target *url.URL) (done bool, err error) {
	r := c.Request()
	p, _ := c.Get(principalKey).(principal)
	holding := Holding{Held: true, URL: target.Scheme + "://" + target.Host} // its epoch read by its watch
	body, again := replayable(c)
	ctx := r.Context()
	var until time.Time
	for {
		if body != nil {
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
		}
		aw := &answerWatch{ResponseWriter: c.Response(), begun: make(chan struct{})}
		fctx, cancel := context.WithCancel(ctx)
		stop := func() {}
		if s.leases != nil {
			stop = s.watchOwner(answerCtx(fctx, aw.begun), cancel, kind, id, holding)
		}
		err := s.proxy.Forward(aw, r.WithContext(fctx), target, encodePrincipal(p))
		stop()
		cancel()
		if err == nil {
			return true, nil
		}
		retry := s.leases != nil && !aw.wrote() && again && ctx.Err() == nil &&
			(errors.Is(err, forward.ErrNotSent) || repeatable(r.Method))
		if !retry {
			c.Response().Header().Set("Retry-After", "1")
			return true, err
		}
		if until.IsZero() {
			until = time.Now().Add(recoverFor(s.leases.Lease()))
		}
		h, ok := s.awaitHolder(ctx, kind, id, until)
		if !ok {
			c.Response().Header().Set("Retry-After", "1")
			return true, newError(http.StatusServiceUnavailable, "UNAVAILABLE", "the replica that owns "+string(kind)+" "+id+" did not answer, and no replica took it over in time")
		}
		if h.Local {
			// Taken over here: the handler answers once the take-over
			// has restored what the request addresses (or in time).
			// Held by no replica: it answers at once, as for what no
			// replica owns.
			if h.Held {
				s.awaitKnown(ctx, kind, id, until)
			}
			if body != nil {
				r.Body = io.NopCloser(bytes.NewReader(body))
			}
			return false, nil
		}
		t, perr := url.Parse(h.URL)
		if perr != nil || t.Host == "" {
			continue
		}
		target, holding = t, h
	}
}

// answerCtx is ctx, ended also once begun is closed: the owner is
// watched until its answer begins.
func answerCtx(ctx context.Context, begun <-chan struct{}) context.Context {
	wctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-begun:
		case <-wctx.Done():
		}
		cancel()
	}()
	return wctx
}

// answerWatch is the client's writer as a forward sees it: begun is
// closed once the owner's answer begins (its header, a write, an upgrade).
type answerWatch struct {
	http.ResponseWriter
	begun chan struct{}
	once  sync.Once
}

func (w *answerWatch) mark() { w.once.Do(func() { close(w.begun) }) }

func (w *answerWatch) wrote() bool {
	select {
	case <-w.begun:
		return true
	default:
		return false
	}
}

func (w *answerWatch) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *answerWatch) WriteHeader(code int) {
	w.mark()
	w.ResponseWriter.WriteHeader(code)
}

func (w *answerWatch) Write(b []byte) (int, error) {
	w.mark()
	return w.ResponseWriter.Write(b)
}

func (w *answerWatch) Flush() {
	http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *answerWatch) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.mark()
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// knownHere says whether this replica's manager has what kind id names.
func (s *Server) knownHere(kind Kind, id string) bool {
	var err error
	switch kind {
	case KindContext:
		_, err = s.mgr.Context(id)
	case KindKernel:
		_, err = s.mgr.Kernel(id)
	case KindRun:
		_, err = s.mgr.Run(id)
	case KindSession:
		_, err = s.mgr.JupyterSessions().Get(id)
	case KindSandbox:
		_, err = s.mgr.Context("e2b-" + id + "-python")
	}
	return err == nil
}

// awaitKnown waits, a few times a lease, until this replica's manager has
// what kind id names (a kernel it took over is being restored with its
// contexts, sessions and runs), until passes, or ctx ends.
func (s *Server) awaitKnown(ctx context.Context, kind Kind, id string, until time.Time) {
	every := min(max(s.leases.Lease()/6, 100*time.Millisecond), time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for !s.knownHere(kind, id) && time.Now().Before(until) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

package gateway

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
)

// logRequests writes one line per request: method, route pattern, status,
// size of the response body and duration. Never the query string, headers
// or body, which may hold tokens or code.
//
// On a connection the gateway serves itself (Serve), the line is written
// once the response has reached the connection: net/http flushes a
// response after its handler returns, so a line written by the handler
// would keep the client waiting for the log. The line waits on the
// connection (connLog) until net/http reports it idle or closed; a
// hijacked connection (a websocket) and a request served through Handler
// by another server get their line when the handler returns.
func (s *Server) logRequests(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		t0 := time.Now()
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		route := c.Path()
		if route == "" {
			route = "unmatched"
		}
		req, resp := c.Request(), c.Response()
		s.metrics.requests.WithLabelValues(route, strconv.Itoa(resp.Status)).Inc()
		line := requestLine{ctx: req.Context(), method: req.Method, route: route,
			status: resp.Status, size: resp.Size, start: t0}
		if cl, ok := req.Context().Value(connLogKey{}).(*connLog); !ok || !cl.hold(line) {
			s.logRequest(line)
		}
		return nil
	}
}

// requestLine is what the line of a request says.
type requestLine struct {
	ctx    context.Context
	method string
	route  string
	status int
	size   int64
	start  time.Time
}

// logRequest writes line, with the time from the request's start until
// now.
func (s *Server) logRequest(line requestLine) {
	level := slog.LevelInfo
	if line.status >= 500 {
		level = slog.LevelWarn
	}
	s.log.LogAttrs(line.ctx, level, "request",
		slog.String("method", line.method),
		slog.String("route", line.route),
		slog.Int("status", line.status),
		slog.Int64("size", line.size),
		slog.Duration("took", time.Since(line.start)))
}

// connLog holds the line of a connection's request until net/http has
// flushed its response.
type connLog struct {
	mu       sync.Mutex
	line     requestLine
	held     bool
	hijacked bool
}

type connLogKey struct{}

// hold keeps line for the connection's next state change, or reports
// false when the connection was hijacked (nothing is left to flush).
func (cl *connLog) hold(line requestLine) bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.hijacked {
		return false
	}
	cl.line, cl.held = line, true
	return true
}

// take returns the line held, if any.
func (cl *connLog) take() (requestLine, bool) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	line, held := cl.line, cl.held
	cl.line, cl.held = requestLine{}, false
	return line, held
}

// connContext gives each connection a connLog (http.Server.ConnContext).
func (s *Server) connContext(ctx context.Context, c net.Conn) context.Context {
	cl := &connLog{}
	s.connLogs.Store(c, cl)
	return context.WithValue(ctx, connLogKey{}, cl)
}

// connState writes a connection's held line once its response is out:
// net/http reports the connection idle after flushing a response, or
// closed (http.Server.ConnState).
func (s *Server) connState(c net.Conn, state http.ConnState) {
	switch state {
	case http.StateIdle, http.StateClosed, http.StateHijacked:
	default:
		return
	}
	v, ok := s.connLogs.Load(c)
	if !ok {
		return
	}
	cl := v.(*connLog)
	switch state {
	case http.StateHijacked:
		cl.mu.Lock()
		cl.hijacked = true
		cl.mu.Unlock()
		s.connLogs.Delete(c)
		return
	case http.StateClosed:
		s.connLogs.Delete(c)
	}
	if line, ok := cl.take(); ok {
		s.logRequest(line)
	}
}

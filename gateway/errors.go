package gateway

import (
	"errors"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"kernelgate/forward"
	"kernelgate/mcp"
	"kernelgate/runs"
	"kernelgate/sessions"
	"kernelgate/workspace"
)

// apiError is an error with its status and code, ready to be written.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func newError(status int, code, msg string) *apiError {
	return &apiError{status: status, code: code, msg: msg}
}

// errorTable maps the sessions and runs sentinels to a status and a code
// of the code-interpreter API; the Jupyter surface uses the status alone.
var errorTable = []struct {
	err    error
	status int
	code   string
}{
	{sessions.ErrBadRequest, http.StatusBadRequest, "BAD_REQUEST"},
	{sessions.ErrInvalidEnv, http.StatusBadRequest, "BAD_REQUEST"},
	{sessions.ErrInvalidLanguage, http.StatusBadRequest, "BAD_REQUEST"},
	{sessions.ErrBadChannel, http.StatusBadRequest, "BAD_REQUEST"},
	{sessions.ErrNoSuchContext, http.StatusNotFound, "SESSION_NOT_FOUND"},
	{sessions.ErrNoSuchKernel, http.StatusNotFound, "NOT_FOUND"},
	{sessions.ErrNoSuchSession, http.StatusNotFound, "NOT_FOUND"},
	{sessions.ErrNoSuchSpec, http.StatusNotFound, "NOT_FOUND"},
	{runs.ErrNoSuchRun, http.StatusNotFound, "NOT_FOUND"},
	{runs.ErrQueueClosed, http.StatusNotFound, "SESSION_NOT_FOUND"},
	{runs.ErrNotAwaitingInput, http.StatusBadRequest, "BAD_REQUEST"},
	{sessions.ErrNameConflict, http.StatusConflict, "NAME_CONFLICT"},
	{sessions.ErrConflict, http.StatusConflict, "NAME_CONFLICT"},
	{sessions.ErrUnsupported, http.StatusConflict, "UNSUPPORTED_OPERATION"},
	{sessions.ErrKernelGone, http.StatusGone, "SESSION_NOT_FOUND"},
	{runs.ErrQueueFull, http.StatusTooManyRequests, "QUEUE_FULL"},
	{sessions.ErrTooManyKernels, http.StatusTooManyRequests, "RESOURCE_EXHAUSTED"},
	{sessions.ErrStartTimeout, http.StatusRequestTimeout, "REQUEST_TIMEOUT"},
	{sessions.ErrTimeout, http.StatusRequestTimeout, "REQUEST_TIMEOUT"},
	{sessions.ErrKernelStart, http.StatusServiceUnavailable, "KERNEL_START_FAILED"},
	{sessions.ErrKernelDead, http.StatusServiceUnavailable, "KERNEL_START_FAILED"},
	{sessions.ErrShuttingDown, http.StatusServiceUnavailable, "UNAVAILABLE"},
	{sessions.ErrSharedElsewhere, http.StatusServiceUnavailable, "NOT_OWNER"},
	{sessions.ErrUnconfirmed, http.StatusServiceUnavailable, "UNAVAILABLE"},
	{workspace.ErrBadPath, http.StatusBadRequest, "BAD_REQUEST"},
	{workspace.ErrEscapes, http.StatusBadRequest, "BAD_REQUEST"},
	{workspace.ErrIsDir, http.StatusBadRequest, "BAD_REQUEST"},
	{workspace.ErrNotDir, http.StatusBadRequest, "BAD_REQUEST"},
	{workspace.ErrTooMany, http.StatusBadRequest, "BAD_REQUEST"},
	{workspace.ErrNotFound, http.StatusNotFound, "NOT_FOUND"},
	{workspace.ErrClosed, http.StatusNotFound, "SESSION_NOT_FOUND"},
	{workspace.ErrTooLarge, http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE"},
	{mcp.ErrReadsBusy, http.StatusTooManyRequests, "RESOURCE_EXHAUSTED"},
	{forward.ErrBadSignature, http.StatusUnauthorized, "UNAUTHORIZED"},
	{forward.ErrStale, http.StatusUnauthorized, "UNAUTHORIZED"},
	{forward.ErrNoSecret, http.StatusUnauthorized, "UNAUTHORIZED"},
	{forward.ErrUnreachable, http.StatusServiceUnavailable, "UNAVAILABLE"},
}

// classify maps any error to an apiError: sessions errors by the table,
// Echo's own errors by their status, anything else to 500 without detail.
func classify(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	for _, row := range errorTable {
		if errors.Is(err, row.err) {
			return newError(row.status, row.code, err.Error())
		}
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		msg := http.StatusText(he.Code)
		if s, ok := he.Message.(string); ok && s != "" {
			msg = s
		}
		return newError(he.Code, codeForStatus(he.Code), msg)
	}
	return newError(http.StatusInternalServerError, "INTERNAL", "internal error")
}

func codeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BAD_REQUEST"
	case http.StatusUnauthorized:
		return "UNAUTHORIZED"
	case http.StatusForbidden:
		return "FORBIDDEN"
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return "NOT_FOUND"
	case http.StatusRequestEntityTooLarge:
		return "PAYLOAD_TOO_LARGE"
	case http.StatusUnsupportedMediaType:
		return "UNSUPPORTED_MEDIA_TYPE"
	case http.StatusTooManyRequests:
		return "RESOURCE_EXHAUSTED"
	case http.StatusRequestTimeout:
		return "REQUEST_TIMEOUT"
	}
	return "INTERNAL"
}

// surface says which error body a route answers with.
type surface int

const (
	jupyterSurface surface = iota // {"message","reason"}
	apiSurface                    // {"code","message"}
	anySurface                    // both, for unknown routes
)

const surfaceKey = "kernelgate.surface"

// errorHandler writes errors in the body of the route's surface.
func (s *Server) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	ae := classify(err)
	if ae.status >= 500 && ae.code == "INTERNAL" {
		s.log.Error("request failed", "route", c.Path(), "err", err)
	}
	sf, tagged := c.Get(surfaceKey).(surface)
	if !tagged {
		// Refused by a check that runs before the route's own middleware
		// (Host, Origin): the route still says which body to answer with.
		sf = s.routeSurface(c.Path())
	}
	if c.Path() == "" || c.Path() == "/*" {
		// No route: a path of the code-interpreter API still gets its
		// body, any other one a body both kinds of clients read.
		sf = anySurface
		if s.routeSurface(c.Request().URL.Path) == apiSurface {
			sf = apiSurface
		}
	}
	if ae.status == http.StatusUnauthorized {
		s.challenge(c, sf)
	}
	if ae.code == "UNAVAILABLE" && c.Response().Header().Get("Retry-After") == "" {
		// The gateway or its database is away for a moment: come back.
		c.Response().Header().Set("Retry-After", "1")
	}
	var body any
	switch sf {
	case jupyterSurface:
		body = map[string]any{"message": ae.msg, "reason": http.StatusText(ae.status)}
	case apiSurface:
		body = map[string]any{"code": ae.code, "message": ae.msg}
	default:
		body = map[string]any{"code": ae.code, "message": ae.msg, "reason": http.StatusText(ae.status)}
	}
	if c.Request().Method == http.MethodHead {
		c.NoContent(ae.status)
		return
	}
	c.JSON(ae.status, body)
}

// routeSurface is the surface of a route pattern, for errors raised
// before the route's group tagged the request.
func (s *Server) routeSurface(route string) surface {
	p := strings.TrimPrefix(route, strings.TrimSuffix(s.cfg.BaseURL, "/"))
	switch {
	case p == "/api/execute", p == "/api/contexts", strings.HasPrefix(p, "/api/contexts/"), p == "/api/context-tokens",
		p == "/api/runs", strings.HasPrefix(p, "/api/runs/"):
		return apiSurface
	case p == "/healthz", p == "/readyz", p == "/metrics", p == "/api/openapi.json":
		return anySurface
	}
	return jupyterSurface
}

// challenge says how to authenticate, as a 401 must (RFC 9110 §11.6.1):
// the code-interpreter API takes a bearer token (RFC 6750); Jupyter
// clients send "Authorization: token <t>", which the gateway also
// accepts, so the Jupyter surface names that scheme first.
func (s *Server) challenge(c echo.Context, sf surface) {
	bearer := `Bearer realm="kernelgate"`
	if credential(c.Request(), true) != "" {
		bearer += `, error="invalid_token"`
	}
	h := c.Response().Header()
	if sf == jupyterSurface {
		h.Add("WWW-Authenticate", `token realm="kernelgate"`)
	}
	h.Add("WWW-Authenticate", bearer)
}

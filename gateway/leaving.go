package gateway

import (
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
)

// closeWhileLeaving answers with "Connection: close" once this replica is
// leaving (handing its kernels over as it stops: GET /readyz answers 503
// from then on), on each answer whose header is written from then on: a
// client holding a keep-alive connection to it opens its next one to
// another replica, rather than send a request on an idle connection the
// server closes at its Shutdown (a race net/http's client cannot retry
// for a POST). Upgrades (websockets) are left as they are.
func (s *Server) closeWhileLeaving(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if upgrade(c.Request()) {
			return next(c)
		}
		res := c.Response()
		res.Before(func() {
			if s.mgr.Leaving() {
				res.Header().Set("Connection", "close")
			}
		})
		return next(c)
	}
}

// upgrade says whether r asks to switch protocols (a websocket).
func upgrade(r *http.Request) bool {
	for _, v := range r.Header.Values("Connection") {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "upgrade") {
				return true
			}
		}
	}
	return false
}

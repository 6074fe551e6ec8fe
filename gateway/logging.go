package gateway

import (
	"log/slog"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
)

// logRequests writes one line per request: method, route pattern, status
// and duration. Never the query string, headers or body, which may hold
// tokens or code.
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
		status := c.Response().Status
		s.metrics.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
		level := slog.LevelInfo
		if status >= 500 {
			level = slog.LevelWarn
		}
		s.log.LogAttrs(c.Request().Context(), level, "request",
			slog.String("method", c.Request().Method),
			slog.String("route", route),
			slog.Int("status", status),
			slog.Duration("took", time.Since(t0)))
		return nil
	}
}

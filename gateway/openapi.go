package gateway

import (
	"net/http"

	"github.com/labstack/echo/v4"
)

// getOpenAPI serves the OpenAPI description of the API.
func (s *Server) getOpenAPI(c echo.Context) error {
	return c.JSON(http.StatusNotImplemented, map[string]string{"code": "NOT_FOUND", "message": "not written yet"})
}

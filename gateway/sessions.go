package gateway

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"kernelgate/sessions"
)

// sessionBody is a session request; the legacy {"notebook": {"path"}}
// form is accepted too.
type sessionBody struct {
	Path     *string `json:"path"`
	Name     *string `json:"name"`
	Type     *string `json:"type"`
	Notebook *struct {
		Path *string `json:"path"`
	} `json:"notebook"`
	Kernel *struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	} `json:"kernel"`
}

func (b *sessionBody) request() sessions.SessionRequest {
	r := sessions.SessionRequest{Path: b.Path, Name: b.Name, Type: b.Type}
	if r.Path == nil && b.Notebook != nil {
		r.Path = b.Notebook.Path
		if r.Type == nil {
			nb := "notebook"
			r.Type = &nb
		}
	}
	if b.Kernel != nil {
		r.Kernel = &sessions.SessionKernel{ID: b.Kernel.ID, Name: b.Kernel.Name}
	}
	return r
}

func (s *Server) listSessions(c echo.Context) error {
	if s.clustered(c) {
		return s.listClusterSessions(c)
	}
	return c.JSON(http.StatusOK, s.mgr.JupyterSessions().List())
}

func (s *Server) getSession(c echo.Context) error {
	sm, err := s.mgr.JupyterSessions().Get(c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, sm)
}

func (s *Server) createSession(c echo.Context) error {
	var body sessionBody
	if err := s.readJSON(c, &body); err != nil {
		return err
	}
	sm, err := s.mgr.JupyterSessions().Create(c.Request().Context(), body.request())
	if err != nil {
		return badSpec(err)
	}
	c.Response().Header().Set("Location", s.path("api/sessions/"+sm.ID))
	return c.JSON(http.StatusCreated, sm)
}

func (s *Server) updateSession(c echo.Context) error {
	var body sessionBody
	if err := s.readJSON(c, &body); err != nil {
		return err
	}
	sm, err := s.mgr.JupyterSessions().Update(c.Request().Context(), c.Param("id"), body.request())
	if err != nil {
		return badSpec(err)
	}
	return c.JSON(http.StatusOK, sm)
}

func (s *Server) deleteSession(c echo.Context) error {
	if err := s.mgr.JupyterSessions().Delete(c.Request().Context(), c.Param("id")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// badSpec makes an unknown kernelspec in a request body a bad request, as
// for POST /api/kernels.
func badSpec(err error) error {
	if errors.Is(err, sessions.ErrNoSuchSpec) {
		return newError(http.StatusBadRequest, "BAD_REQUEST", err.Error())
	}
	return err
}

package gateway

import (
	"context"
	"encoding/json"
	"time"

	"github.com/labstack/echo/v4"
)

// sessionLookupTimeout bounds the store's look-up of a session by path.
const sessionLookupTimeout = 5 * time.Second

// sessionOfPath is, among replicas, the session a POST /api/sessions
// naming no kernel addresses: the one of its path another replica made
// (as the store records it), which is forwarded to that session's owner
// and answered there (as Jupyter Server answers with the existing
// session of a path) rather than made a second time here. "" (answered
// here) for one gateway, a request another replica forwarded, a body
// that names a kernel or no path, a path this replica has a session of,
// or one the store has none of. A body naming a kernelspec (no kernel
// id) addresses the path's session too, as it does on one gateway.
func (s *Server) sessionOfPath(c echo.Context, body []byte) string {
	if s.cluster == nil || c.Get(forwardedKey) != nil {
		return ""
	}
	var b sessionBody
	if json.Unmarshal(body, &b) != nil || b.Kernel != nil && b.Kernel.ID != "" {
		return ""
	}
	path := b.request().Path
	if path == nil || *path == "" {
		return ""
	}
	for _, sm := range s.mgr.JupyterSessions().List() {
		if sm.Path == *path {
			return ""
		}
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), sessionLookupTimeout)
	defer cancel()
	id, found, err := s.cluster.SessionByPath(ctx, *path)
	if err != nil {
		s.log.Warn("replicas: the store could not be asked for the session of a path: a session is made here", "err", err)
		return ""
	}
	if !found {
		return ""
	}
	return id
}

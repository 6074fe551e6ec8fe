package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/labstack/echo/v4"

	"kernelgate/sessions"
)

// Among replicas, a run without context goes to its language's shared
// context, one for the cluster (sessions.ErrSharedElsewhere): the
// middleware forwards it when the store already names its owner; a
// replica that lost the race to claim it forwards it once the claim is
// decided (forwardShared). And a Jupyter session made for an existing
// kernel is made by the kernel's owner (sessionKernel).

// sessionKernel is the existing kernel a POST /api/sessions body names.
func sessionKernel(_ echo.Context, body []byte) string {
	var b struct {
		Kernel *struct {
			ID string `json:"id"`
		} `json:"kernel"`
	}
	if json.Unmarshal(body, &b) != nil || b.Kernel == nil {
		return ""
	}
	return b.Kernel.ID
}

// forwardShared answers a request whose run failed with err: when err
// says another replica serves the shared context the run went to (it
// won the claim), the request is forwarded there; any other err is
// returned as it is.
func (s *Server) forwardShared(c echo.Context, err error) error {
	var se *sessions.SharedElsewhere
	if !errors.As(err, &se) {
		return err
	}
	notOwner := func() error {
		c.Response().Header().Set("Retry-After", "1")
		return newError(http.StatusServiceUnavailable, "NOT_OWNER", se.Error()+": retry")
	}
	body, ok := c.Get(bodyKey).([]byte)
	if s.proxy == nil || !ok || c.Get(forwardedKey) != nil {
		return notOwner()
	}
	r := c.Request()
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	if done, err := s.forwardTo(c, KindContext, se.Context); done || err != nil {
		return err
	}
	return notOwner()
}

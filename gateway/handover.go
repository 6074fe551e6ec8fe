package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"kernelgate/sessions"
)

// This file is the gateway's side of a replica's handover of its kernels
// as it stops (sessions.Manager.HandOver): a request whose kernel was
// handed over while it was being answered here is sent on to the new
// owner, and the new owner is asked to take the kernel over at once.

// sendOnIfMoved sends c's request on to the replica that owns its
// kernel now when err, its handler's answer, says the kernel was handed
// over (sessions.MovedError) before anything was written; otherwise it
// returns err. The request is sent even when another replica forwarded
// it here: the new owner is the lease's holder, and it is not sent on
// again from there.
func (s *Server) sendOnIfMoved(c echo.Context, err error) error {
	var moved *sessions.MovedError
	if !errors.As(err, &moved) || c.Response().Committed {
		return err
	}
	r := c.Request()
	body, _ := c.Get(bodyKey).([]byte)
	if body == nil && r.ContentLength != 0 {
		// A body streamed to the handler cannot be sent again.
		c.Response().Header().Set("Retry-After", "1")
		return err
	}
	owner, err := moved.NewOwner(r.Context())
	if err != nil {
		c.Response().Header().Set("Retry-After", "1")
		return err
	}
	target, perr := url.Parse(owner)
	if perr != nil || target.Host == "" {
		c.Response().Header().Set("Retry-After", "1")
		return newError(http.StatusServiceUnavailable, "UNAVAILABLE", moved.What+": the replica it was handed over to advertises no usable URL")
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	p, _ := c.Get(principalKey).(principal)
	if err := s.proxy.Forward(c.Response(), r, target, encodePrincipal(p)); err != nil {
		c.Response().Header().Set("Retry-After", "1")
		return err
	}
	return nil
}

// AskToAdopt asks the replica at owner (its advertised URL) to take the
// kernel over now, the kernel's lease having been handed to it: a
// request for the kernel signed as a replica, which it answers once it
// has taken the kernel over.
func (s *Server) AskToAdopt(ctx context.Context, owner, kernel string) error {
	if s.cfg.ClusterSecret == nil {
		return errors.New("replicas: no cluster secret")
	}
	u := strings.TrimSuffix(owner, "/") + s.BaseURL() + "api/kernels/" + url.PathEscape(kernel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	s.cfg.ClusterSecret.Sign(req.Header, req.Method, req.URL.RequestURI(), encodePrincipal(principal{name: "replica", scopes: ScopeRead}), time.Now())
	resp, err := adoptClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("replicas: %s answered %s", owner, resp.Status)
	}
	return nil
}

// adoptClient asks other replicas to adopt kernels.
var adoptClient = &http.Client{Timeout: 30 * time.Second}

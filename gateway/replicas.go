package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"kernelgate/forward"
)

// This file is the gateway's side of replicas: asking which replica owns
// what a request addresses (Owners), forwarding the request there when it
// is another one (forward.Proxy), and accepting a request another replica
// forwarded, with the principal it authenticated.
//
// With no Owners (one gateway) none of it is installed: the routes' own
// handlers run as they always did.

// Kind is what a route addresses, for Owners.
type Kind string

// The kinds of things a route addresses.
const (
	KindKernel  Kind = "kernel"  // /api/kernels/{id}…
	KindContext Kind = "context" // /api/contexts/{id}…, execute's and MCP's "context"
	KindRun     Kind = "run"     // /api/runs/{id}…
	KindSession Kind = "session" // /api/sessions/{id}
	KindSandbox Kind = "sandbox" // /e2b/sandboxes/{id}…, E2b-Sandbox-Id
)

// Owners says which replica owns what a request addresses.
type Owners interface {
	// Owner returns the advertised URL of the replica that owns the thing
	// of kind and id, and local when that is this replica. What no
	// replica owns (an unknown id, a kernel free to take) is local: this
	// replica answers it (404, or takes it). An error is answered as
	// classify maps it, 503 UNAVAILABLE when it maps to nothing.
	Owner(ctx context.Context, kind Kind, id string) (url string, local bool, err error)
}

// forwardedKey marks a request another replica forwarded.
const forwardedKey = "kernelgate.forwarded"

// wirePrincipal is a principal as it travels between replicas.
type wirePrincipal struct {
	Name           string    `json:"name"`
	Scopes         Scope     `json:"scopes"`
	Context        string    `json:"context,omitempty"`
	ContextCreated time.Time `json:"contextCreated,omitzero"`
	// Run and Accepted: a run the forwarding replica accepted and
	// recorded under that id (replicas_runs.go).
	Run      string    `json:"run,omitempty"`
	Accepted time.Time `json:"accepted,omitzero"`
}

func encodePrincipal(p principal) []byte {
	b, _ := json.Marshal(wirePrincipal{Name: p.name, Scopes: p.scopes, Context: p.context, ContextCreated: p.contextCreated})
	return b
}

func decodePrincipal(b []byte) (principal, bool) {
	var w wirePrincipal
	if err := json.Unmarshal(b, &w); err != nil || w.Name == "" || w.Scopes&^allScopes != 0 {
		return principal{}, false
	}
	return principal{name: w.Name, scopes: w.Scopes, context: w.Context, contextCreated: w.ContextCreated}, true
}

// setupReplicas makes the proxy when the gateway has owners to ask.
func (s *Server) setupReplicas() {
	if s.cfg.Owners == nil {
		return
	}
	if s.cfg.ClusterSecret == nil {
		s.log.Error("replicas: no cluster secret (--cluster-secret-file, KERNELGATE_CLUSTER_SECRET): requests are not forwarded to other replicas")
		return
	}
	s.owners = s.cfg.Owners
	s.leases, _ = s.cfg.Owners.(Leases)
	s.proxy = forward.New(s.cfg.ClusterSecret, s.log)
	if s.cfg.Cluster != nil {
		s.cluster, s.peers = s.cfg.Cluster, newPeerClient()
	}
}

// fromReplica authenticates a request another replica forwarded: its
// principal is trusted only when the cluster secret's signature checks.
func (s *Server) fromReplica(c echo.Context, next echo.HandlerFunc) error {
	b, err := s.cfg.ClusterSecret.Verify(c.Request(), time.Now())
	if err != nil {
		return err
	}
	p, ok := decodePrincipal(b)
	if !ok {
		return newError(http.StatusUnauthorized, "UNAUTHORIZED", "a forwarded request carries no principal")
	}
	c.Set(principalKey, p)
	c.Set(forwardedKey, true)
	if f := decodeForwardedRun(b); f.ID != "" {
		c.Set(forwardedRunKey, f)
	}
	return next(c)
}

// forwardedPrincipal is the principal of a forwarded request's headers,
// for the handlers that read credentials from headers alone (MCP). It
// does not verify the signature: it is only called behind authenticate,
// which refused the request unless the signature checked.
func forwardedPrincipal(h http.Header) (principal, bool) {
	b, ok := forward.Principal(h)
	if !ok {
		return principal{}, false
	}
	return decodePrincipal(b)
}

// owned returns the middleware that forwards a route's requests to the
// owner of kind, the id being the route's parameter param; with no
// owners, none.
func (s *Server) owned(kind Kind, param string) echo.MiddlewareFunc {
	return s.ownedBy(kind, func(c echo.Context) string { return c.Param(param) })
}

// ownedBy is owned with the id found by id ("" for none: local).
func (s *Server) ownedBy(kind Kind, id func(echo.Context) string) echo.MiddlewareFunc {
	if s.proxy == nil {
		return func(next echo.HandlerFunc) echo.HandlerFunc { return next }
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if id := id(c); id != "" {
				if done, err := s.forwardTo(c, kind, id); done || err != nil {
					return err
				}
			}
			return s.sendOnIfMoved(c, next(c))
		}
	}
}

// ownedInBody is ownedBy for an id in a JSON body (execute, MCP): the
// body, up to the body limit, is read to find it and then given whole to
// the handler or the owner.
func (s *Server) ownedInBody(kind Kind, find func(c echo.Context, body []byte) string) echo.MiddlewareFunc {
	return s.ownedBy(kind, func(c echo.Context) string {
		r := c.Request()
		body, err := io.ReadAll(io.LimitReader(r.Body, s.cfg.MaxBodyBytes+1))
		// Whatever was read goes back in front of the rest: over the
		// limit, or broken off, the handler answers as it always does.
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
		if err != nil || int64(len(body)) > s.cfg.MaxBodyBytes {
			return ""
		}
		c.Set(bodyKey, body) // for forwardShared and sendOnIfMoved
		return find(c, body)
	})
}

// executeContext is the context an execute body names; none (and not
// isolated) names the shared context of its language or kernelspec,
// which among replicas one of them serves for all.
func (s *Server) executeContext(_ echo.Context, body []byte) string {
	var b struct {
		Context    string `json:"context"`
		Isolated   bool   `json:"isolated"`
		Language   string `json:"language"`
		Kernelspec string `json:"kernelspec"`
	}
	json.Unmarshal(body, &b)
	if b.Context == "" && !b.Isolated && s.cluster != nil {
		return s.mgr.Catalog().SharedID(b.Language, b.Kernelspec)
	}
	return b.Context
}

// mcpContext is the context an MCP tool call names; none is a context
// token's own context, else (among replicas) the shared context run_code
// and run_command go to.
func (s *Server) mcpContext(c echo.Context, body []byte) string {
	var b struct {
		Method string `json:"method"`
		Params struct {
			Name      string `json:"name"`
			Arguments struct {
				Context    string `json:"context"`
				Language   string `json:"language"`
				Kernelspec string `json:"kernelspec"`
			} `json:"arguments"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &b) != nil || b.Method != "tools/call" {
		return ""
	}
	args := b.Params.Arguments
	if args.Context != "" {
		return args.Context
	}
	if p, _ := c.Get(principalKey).(principal); p.context != "" {
		return p.context
	}
	if s.cluster == nil {
		return ""
	}
	switch b.Params.Name {
	case "run_code":
		return s.mgr.Catalog().SharedID(args.Language, args.Kernelspec)
	case "run_command":
		return s.mgr.Catalog().SharedID("python", "")
	}
	return ""
}

// e2bSandbox is the sandbox an E2B request names: in its path
// (/e2b/sandboxes/{id}…, /e2b/v2/sandboxes/{id}…) or its E2b-Sandbox-Id
// header.
func (s *Server) e2bSandbox(c echo.Context) string {
	if id := c.Request().Header.Get("E2b-Sandbox-Id"); id != "" {
		return id
	}
	p := strings.TrimPrefix(c.Param("*"), "v2/")
	rest, ok := strings.CutPrefix(p, "sandboxes/")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, "/")
	return id
}

// e2bFromReplica verifies a forwarded request to the E2B endpoint, which
// authenticates with E2B's own headers (checked by its handler) rather
// than behind authenticate: the signature only says a replica sent it.
func (s *Server) e2bFromReplica(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if forward.Forwarded(c.Request().Header) {
			if _, err := s.cfg.ClusterSecret.Verify(c.Request(), time.Now()); err != nil {
				return err
			}
			c.Set(forwardedKey, true)
		}
		return next(c)
	}
}

// forwardTo forwards c's request to the replica that owns kind id, unless
// this one does; done says the request was answered (or failed) there.
// A request another replica forwarded is never forwarded again: if this
// replica does not own what it addresses (ownership moved on the way), it
// is refused with NOT_OWNER, for the client to retry.
func (s *Server) forwardTo(c echo.Context, kind Kind, id string) (done bool, err error) {
	runs := s.leases != nil && kind == KindContext && runRoute(c) && c.Get(forwardedKey) == nil
	if runs && !s.servesContext(id) {
		if owner, ok := s.holders.get(kind, id, time.Now()); ok {
			if target, err := url.Parse(owner); err == nil && target.Host != "" {
				return s.forwardRun(c, kind, id, target, true)
			}
		}
	}
	asked := time.Now()
	owner, local, err := s.owners.Owner(c.Request().Context(), kind, id)
	if err != nil {
		if ae := classify(err); ae.status != http.StatusInternalServerError {
			return true, ae
		}
		return true, newError(http.StatusServiceUnavailable, "UNAVAILABLE", "finding the replica that owns "+string(kind)+" "+id+": "+err.Error())
	}
	if local {
		return false, nil
	}
	if c.Get(forwardedKey) != nil {
		c.Response().Header().Set("Retry-After", "1")
		return true, newError(http.StatusServiceUnavailable, "NOT_OWNER",
			"the replica this request was forwarded to does not own "+string(kind)+" "+id+" (it moved on the way): retry")
	}
	target, err := url.Parse(owner)
	if err != nil || target.Host == "" {
		return true, newError(http.StatusServiceUnavailable, "UNAVAILABLE", "the replica that owns "+string(kind)+" "+id+" advertises no usable URL")
	}
	if s.leases != nil {
		if runs {
			s.holders.put(kind, id, owner, asked.Add(s.leases.Lease()/3))
		}
		if runRoute(c) {
			return s.forwardRun(c, kind, id, target, false)
		}
		return s.forwardRetrying(c, kind, id, target)
	}
	p, _ := c.Get(principalKey).(principal)
	if err := s.proxy.Forward(c.Response(), c.Request(), target, encodePrincipal(p)); err != nil {
		c.Response().Header().Set("Retry-After", "1")
		return true, err
	}
	return true, nil
}

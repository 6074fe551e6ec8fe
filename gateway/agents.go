package gateway

import (
	"context"
	"net/http"

	"kernelgate/e2b"
	"kernelgate/forward"
	"kernelgate/mcp"
)

// This file builds the doors agents use: MCP at /mcp, whose handler
// authorises each tool call itself from the headers of its request
// (mcpAccess), and the E2B-compatible endpoint under /e2b, which reads
// E2B's own headers (e2bAccess for X-API-KEY; a sandbox's access token it
// checks itself).

// mcpAccess maps a request's credentials to what its tool calls may do.
func (s *Server) mcpAccess(h http.Header) (mcp.Access, error) {
	if forward.Forwarded(h) {
		// From another replica, whose signature authenticate checked.
		p, ok := forwardedPrincipal(h)
		if !ok {
			return mcp.Access{}, newError(http.StatusUnauthorized, "UNAUTHORIZED", "a forwarded request carries no principal")
		}
		return mcp.Access{Read: p.scopes&ScopeRead != 0, Exec: p.scopes&ScopeExec != 0,
			Context: p.context, ContextCreated: p.contextCreated}, nil
	}
	if !s.authRequired() {
		return mcp.Access{Read: true, Exec: true}, nil
	}
	p, ok, expired := s.identify(credential(&http.Request{Header: h}, false))
	if expired {
		return mcp.Access{}, newError(http.StatusForbidden, "FORBIDDEN", "the context token has expired: ask for a new one")
	}
	if !ok {
		return mcp.Access{}, newError(http.StatusUnauthorized, "UNAUTHORIZED", "invalid credentials")
	}
	return mcp.Access{Read: p.scopes&ScopeRead != 0, Exec: p.scopes&ScopeExec != 0,
		Context: p.context, ContextCreated: p.contextCreated}, nil
}

// describe names an error for a tool result: its code and message.
func describe(err error) (string, string) {
	ae := classify(err)
	return ae.code, ae.msg
}

// mcpHandler builds the MCP handler.
func (s *Server) mcpHandler() http.Handler {
	return mcp.New(mcp.Config{
		Authorize:      s.mcpAccess,
		Describe:       describe,
		ContextDeleted: s.tokens.revoke,
		Contexts:       s.mcpContexts,
		Files:          mcp.WorkspaceFiles(s.mgr, s.cfg.MaxUploadBytes),
		MaxBodyBytes:   s.cfg.MaxBodyBytes,
		Version:        s.cfg.ProductVersion,
		Logger:         s.log,
	}, s.mgr)
}

// e2bAccess maps an X-API-KEY (a kernelgate token or API key) to what it
// may do on the E2B sandbox API; context tokens do not reach it.
func (s *Server) e2bAccess(key string) (e2b.Access, error) {
	if !s.authRequired() {
		return e2b.Access{Read: true, Exec: true}, nil
	}
	p, ok, _ := s.identify(key)
	if !ok {
		return e2b.Access{}, newError(http.StatusUnauthorized, "UNAUTHORIZED", "invalid X-API-KEY: give a kernelgate token or API key")
	}
	if p.context != "" {
		return e2b.Access{}, newError(http.StatusForbidden, "FORBIDDEN", "a context token cannot manage sandboxes")
	}
	return e2b.Access{Read: p.scopes&ScopeRead != 0, Exec: p.scopes&ScopeExec != 0}, nil
}

// e2bHandler builds the E2B-compatible handler.
func (s *Server) e2bHandler() *e2b.Handler {
	var owned func(ctx context.Context, sandboxID string) (bool, error)
	if s.cfg.Owners != nil {
		// With replicas a sandbox's timeout and its record are its
		// owner's: the replica holding its default context's kernel.
		owned = func(ctx context.Context, id string) (bool, error) {
			_, local, err := s.cfg.Owners.Owner(ctx, KindSandbox, id)
			return local, err
		}
	}
	return e2b.New(e2b.Config{
		Owned:     owned,
		Authorize: s.e2bAccess,
		Describe: func(err error) (int, string) {
			ae := classify(err)
			return ae.status, ae.code + ": " + ae.msg
		},
		MaxBodyBytes:   s.cfg.MaxBodyBytes,
		MaxUploadBytes: s.cfg.MaxUploadBytes,
		Logger:         s.log,
	}, s.mgr)
}

package gateway

import (
	"net/http"

	"kernelgate/mcp"
)

// This file mounts the doors agents use: MCP at /mcp. The handler
// authorises each tool call itself, from the headers of its request,
// through mcpAccess.

// mcpAccess maps a request's credentials to what its tool calls may do.
func (s *Server) mcpAccess(h http.Header) (mcp.Access, error) {
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
		MaxBodyBytes:   s.cfg.MaxBodyBytes,
		Version:        s.cfg.ProductVersion,
		Logger:         s.log,
	}, s.mgr)
}

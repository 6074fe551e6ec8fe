package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"net/url"
	"strings"

	"github.com/labstack/echo/v4"
)

// credential extracts the token a request carries: the Authorization
// header ("token <t>" as Jupyter sends it, or "Bearer <t>"), or the token
// query parameter where headers cannot be set (websocket upgrades from
// browsers, and files a page loads).
func credential(r *http.Request, queryAllowed bool) string {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
		if ok && (strings.EqualFold(scheme, "token") || strings.EqualFold(scheme, "bearer")) {
			return strings.TrimSpace(tok)
		}
		return ""
	}
	if queryAllowed {
		return r.URL.Query().Get("token")
	}
	return ""
}

// equalSecret compares two secrets in constant time, whatever their lengths.
func equalSecret(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}

// isUpgrade reports whether r asks for a websocket.
func isUpgrade(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// authenticate requires the token on the routes it guards.
func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if s.cfg.Token == "" {
			return next(c)
		}
		r := c.Request()
		queryAllowed := isUpgrade(r) || (r.Method == http.MethodGet || r.Method == http.MethodHead) && strings.HasPrefix(c.Path(), strings.TrimSuffix(s.cfg.BaseURL, "/")+"/kernelspecs/")
		tok := credential(r, queryAllowed)
		if tok == "" {
			return newError(http.StatusUnauthorized, "UNAUTHORIZED", "authentication required: send Authorization: Bearer <token>")
		}
		if !equalSecret(tok, s.cfg.Token) {
			return newError(http.StatusUnauthorized, "UNAUTHORIZED", "invalid credentials")
		}
		return next(c)
	}
}

// originAllowed reports whether a browser request may come from its
// Origin: none (not a browser), the gateway's own host, or an entry of
// the allowed origins.
func (s *Server) originAllowed(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	if s.listedOrigin(origin) {
		return true
	}
	u, err := url.Parse(origin)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host)
}

func (s *Server) listedOrigin(origin string) bool {
	for _, a := range s.cfg.AllowOrigins {
		if a == "*" || a == origin {
			return true
		}
	}
	return false
}

// cors answers preflights and adds CORS headers for allowed origins.
func (s *Server) cors(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		origin := r.Header.Get("Origin")
		if origin == "" || !s.listedOrigin(origin) {
			return next(c)
		}
		h := c.Response().Header()
		h.Set("Access-Control-Allow-Origin", origin)
		h.Add("Vary", "Origin")
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Set("Access-Control-Allow-Methods", "GET, PUT, POST, PATCH, DELETE, OPTIONS")
			h.Set("Access-Control-Allow-Headers", "accept, content-type, authorization, x-xsrftoken")
			h.Set("Access-Control-Max-Age", "600")
			return c.NoContent(http.StatusNoContent)
		}
		return next(c)
	}
}

package gateway

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"kernelgate/forward"
)

// Scope is what a credential may do.
type Scope uint8

// The scopes of API keys: read lists and gets; exec runs code and manages
// contexts, kernels and sessions (kernel websockets included).
const (
	ScopeRead Scope = 1 << iota
	ScopeExec
	allScopes = ScopeRead | ScopeExec
)

// ParseScopes reads "read", "exec" or "read,exec".
func ParseScopes(s string) (Scope, error) {
	var sc Scope
	for _, part := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == '+' || r == ' ' }) {
		switch part {
		case "read":
			sc |= ScopeRead
		case "exec":
			sc |= ScopeExec
		default:
			return 0, fmt.Errorf("unknown scope %q (read, exec)", part)
		}
	}
	if sc == 0 {
		return 0, fmt.Errorf("no scope")
	}
	return sc, nil
}

// APIKey is a configured key: only the SHA-256 of its secret is kept.
type APIKey struct {
	Name   string
	Scopes Scope
	Hash   [sha256.Size]byte
}

// HashSecret returns the form a key file may hold instead of the secret.
func HashSecret(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return "sha256:" + hex.EncodeToString(h[:])
}

// ParseAPIKey reads "name scopes secret" (or name:scopes:secret); the
// secret may be given as sha256:<hex>.
func ParseAPIKey(line string) (APIKey, error) {
	fields := strings.Fields(line)
	if len(fields) != 3 {
		fields = strings.SplitN(strings.TrimSpace(line), ":", 3)
	}
	if len(fields) != 3 || fields[0] == "" {
		return APIKey{}, fmt.Errorf("want: name scopes secret")
	}
	sc, err := ParseScopes(fields[1])
	if err != nil {
		return APIKey{}, err
	}
	k := APIKey{Name: fields[0], Scopes: sc}
	secret := strings.TrimSpace(fields[2])
	if hexed, ok := strings.CutPrefix(secret, "sha256:"); ok {
		b, err := hex.DecodeString(hexed)
		if err != nil || len(b) != sha256.Size {
			return APIKey{}, fmt.Errorf("sha256: want 64 hex digits")
		}
		copy(k.Hash[:], b)
		return k, nil
	}
	if len(secret) < 16 {
		return APIKey{}, fmt.Errorf("secret shorter than 16 characters")
	}
	k.Hash = sha256.Sum256([]byte(secret))
	return k, nil
}

// LoadAPIKeys reads a key file: one "name scopes secret" per line, #
// comments and blank lines ignored.
func LoadAPIKeys(path string) ([]APIKey, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var keys []APIKey
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := ParseAPIKey(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		keys = append(keys, k)
	}
	return keys, sc.Err()
}

// principal is who a request is from.
type principal struct {
	name   string
	scopes Scope
	// context, for a context token: the one context it may use.
	context        string
	contextCreated time.Time
}

const principalKey = "kernelgate.principal"

// contextToken is a minted context token (kept hashed).
type contextToken struct {
	context        string
	contextCreated time.Time
	expires        time.Time
}

// tokenStore holds context tokens.
type tokenStore struct {
	mu     sync.Mutex
	tokens map[[sha256.Size]byte]contextToken
}

func (ts *tokenStore) mint(ctxID string, created time.Time, ttl time.Duration) (string, time.Time) {
	b := make([]byte, 32)
	rand.Read(b)
	tok := contextTokenPrefix + hex.EncodeToString(b)
	exp := time.Now().Add(ttl)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	now := time.Now()
	for h, t := range ts.tokens {
		if now.After(t.expires) {
			delete(ts.tokens, h)
		}
	}
	ts.tokens[sha256.Sum256([]byte(tok))] = contextToken{context: ctxID, contextCreated: created, expires: exp}
	return tok, exp
}

func (ts *tokenStore) lookup(tok string) (contextToken, bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t, ok := ts.tokens[sha256.Sum256([]byte(tok))]
	return t, ok
}

// revoke drops every token of a context.
func (ts *tokenStore) revoke(ctxID string) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for h, t := range ts.tokens {
		if t.context == ctxID {
			delete(ts.tokens, h)
		}
	}
}

// revokeAll drops every context token.
func (ts *tokenStore) revokeAll() {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	clear(ts.tokens)
}

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

// authRequired reports whether the gateway checks credentials at all.
func (s *Server) authRequired() bool { return s.cfg.Token != "" || len(s.keys) > 0 }

// identify maps a token to a principal; ok is false for an unknown one,
// expired true for a context token past its TTL.
func (s *Server) identify(tok string) (p principal, ok, expired bool) {
	if s.cfg.Token != "" && equalSecret(tok, s.cfg.Token) {
		return principal{name: "token", scopes: allScopes}, true, false
	}
	h := sha256.Sum256([]byte(tok))
	for _, k := range s.keys {
		if subtle.ConstantTimeCompare(h[:], k.Hash[:]) == 1 {
			return principal{name: k.Name, scopes: k.Scopes}, true, false
		}
	}
	if ct, found := s.tokens.lookup(tok); found {
		if time.Now().After(ct.expires) {
			return principal{}, false, true
		}
		return principal{name: "context-token", scopes: allScopes, context: ct.context, contextCreated: ct.contextCreated}, true, false
	}
	return principal{}, false, false
}

// authenticate requires credentials on the routes it guards.
func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if forward.Forwarded(c.Request().Header) {
			return s.fromReplica(c, next)
		}
		if !s.authRequired() {
			c.Set(principalKey, principal{name: "anonymous", scopes: allScopes})
			return next(c)
		}
		r := c.Request()
		queryAllowed := isUpgrade(r) || (r.Method == http.MethodGet || r.Method == http.MethodHead) && strings.HasPrefix(c.Path(), strings.TrimSuffix(s.cfg.BaseURL, "/")+"/kernelspecs/")
		tok := credential(r, queryAllowed)
		if tok == "" {
			return newError(http.StatusUnauthorized, "UNAUTHORIZED", "authentication required: send Authorization: Bearer <token>")
		}
		p, ok, expired := s.identify(tok)
		if !ok && !expired {
			// A context token another replica minted.
			p, ok, expired = s.clusterToken(r.Context(), tok)
		}
		if expired {
			return newError(http.StatusForbidden, "FORBIDDEN", "the context token has expired: ask for a new one")
		}
		if !ok {
			return newError(http.StatusUnauthorized, "UNAUTHORIZED", "invalid credentials")
		}
		c.Set(principalKey, p)
		return next(c)
	}
}

// need returns a middleware requiring a scope; context tokens are refused
// unless the route checks the context itself (allowContextToken).
func (s *Server) need(scope Scope, allowContextToken bool) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			p, _ := c.Get(principalKey).(principal)
			if p.context != "" && !allowContextToken {
				return newError(http.StatusForbidden, "FORBIDDEN", "a context token may only use its context")
			}
			if p.scopes&scope == 0 {
				return newError(http.StatusForbidden, "FORBIDDEN", fmt.Sprintf("these credentials lack the %s scope", scopeName(scope)))
			}
			return next(c)
		}
	}
}

func scopeName(s Scope) string {
	if s == ScopeRead {
		return "read"
	}
	return "exec"
}

// checkContext refuses a context token used on another context, or on a
// context deleted and made again since the token was minted.
func (s *Server) checkContext(c echo.Context, ctxID string) error {
	p, _ := c.Get(principalKey).(principal)
	if p.context == "" {
		return nil
	}
	if p.context != ctxID {
		return newError(http.StatusForbidden, "FORBIDDEN", "this context token is for another context")
	}
	ctx, err := s.mgr.Context(ctxID)
	if err != nil || !ctx.Created().Equal(p.contextCreated) {
		return newError(http.StatusForbidden, "FORBIDDEN", "this context token was revoked with its context")
	}
	return nil
}

// loopbackHost reports whether a Host header names this machine.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// guardBrowsers refuses what a page of another site could make a browser
// send. Without credentials, a request must name this machine in its
// Host (a DNS-rebinding page names its own); and a request that changes
// something with an Origin that is not allowed is refused (a form or a
// text/plain POST needs no preflight).
func (s *Server) guardBrowsers(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if !s.authRequired() && !loopbackHost(r.Host) {
			return newError(http.StatusForbidden, "FORBIDDEN", "without a token kernelgate answers only requests for localhost; set --token to serve other host names")
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
		default:
			if !s.originAllowed(r) {
				return newError(http.StatusForbidden, "FORBIDDEN", "cross-origin request refused: origin not allowed")
			}
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
	return err == nil && u.Host != "" && u.User == nil && strings.EqualFold(u.Host, r.Host)
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

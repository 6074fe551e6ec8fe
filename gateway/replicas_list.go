package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"kernelgate/mcp"
	"kernelgate/sessions"

	"kernelgate/internal/timefmt"
)

// This file makes the listings the cluster's when replicas share one
// store: GET /api/kernels, /api/contexts, /api/sessions, the E2B
// sandboxes and the counts of GET /api/status answer with this replica's
// own live models and every other live replica's. Each other replica is
// asked for its own part (the same request, signed for the caller's
// principal: a forwarded listing is answered with the receiver's own
// part only), all in parallel, for at most listTimeout; what a replica
// that did not answer in time owns is listed from its records in the
// store (Cluster.Stored), the fields only its owner knows live shown as
// recorded. It also finds in the store the context tokens another
// replica minted.
//
// With no Cluster (one gateway) none of it runs.

// Cluster is what a replica knows of the others through the store.
type Cluster interface {
	// Self is this replica's advertised URL; Replicas are the live
	// replicas' (Self among them).
	Self() string
	Replicas() []string
	// Stored reads every kernel, context, session and sandbox record of
	// the store as the API shows it, with the URL of the replica that
	// holds its kernel's lease ("" for none).
	Stored(ctx context.Context) (*StoredListing, error)
	// ContextToken finds the context that keeps a context token of hash,
	// whichever replica minted it; found false when none does.
	ContextToken(ctx context.Context, hash [sha256.Size]byte) (t StoredToken, found bool, err error)
	// SessionByPath finds the Jupyter session of path, whichever replica
	// made it; found false when there is none.
	SessionByPath(ctx context.Context, path string) (id string, found bool, err error)
}

// Listed is an entry of a listing read from the store.
type Listed struct {
	ID string
	// Replica is the advertised URL of the replica that owns it, "" when
	// no replica holds its kernel's lease.
	Replica string
	// Model is what the API shows of it.
	Model any
}

// StoredListing is what Cluster.Stored reads, by listing.
type StoredListing struct {
	Kernels, Contexts, Sessions, Sandboxes []Listed
}

// StoredToken is a context token kept in the store with its context.
type StoredToken struct {
	Context                 string
	ContextCreated, Expires time.Time
}

// listTimeout is how long a listing waits for the other replicas' parts;
// a replica that has not answered by then (frozen, cut off) is listed
// from the store.
var listTimeout = time.Second

// tokenTimeout bounds the store's look-up of a context token.
const tokenTimeout = 5 * time.Second

// clustered says whether c's listing is the cluster's: a replica asked
// by a client (not by another replica, which wants this one's own part).
func (s *Server) clustered(c echo.Context) bool {
	return s.cluster != nil && c.Get(forwardedKey) == nil
}

// peerClient asks the other replicas for their parts.
func newPeerClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 16
	return &http.Client{Transport: tr, Timeout: listTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// part is one replica's part of a listing.
type part struct {
	url   string
	items []json.RawMessage
	ok    bool
}

// peerParts sends c's request (a GET) to every other live replica, signed
// for c's principal, with the headers keep copies from c's request, and
// returns each one's answer, in the order of their URLs; a part is not
// ok when its replica did not answer 200 with a JSON array in time.
func (s *Server) peerParts(c echo.Context, keep []string) []part {
	p, _ := c.Get(principalKey).(principal)
	return s.peerPartsFor(c.Request(), encodePrincipal(p), keep)
}

// peerPartsFor is peerParts for the request r, signed for principal.
func (s *Server) peerPartsFor(r *http.Request, principal []byte, keep []string) []part {
	self := s.cluster.Self()
	var parts []part
	for _, u := range s.cluster.Replicas() {
		if u != self {
			parts = append(parts, part{url: u})
		}
	}
	if len(parts) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(r.Context(), listTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for i := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			parts[i].items, parts[i].ok = s.askPeer(ctx, parts[i].url, r, keep, principal)
		}()
	}
	wg.Wait()
	return parts
}

// peerRequest is r (its method, path and query, without a body) for the
// replica at base, signed for principal, with the headers keep copies.
func (s *Server) peerRequest(ctx context.Context, base string, r *http.Request, keep []string, principal []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, r.Method, strings.TrimSuffix(base, "/")+r.URL.RequestURI(), nil)
	if err != nil {
		return nil, err
	}
	req.Host = r.Host
	for _, h := range keep {
		if v := r.Header.Values(h); len(v) > 0 {
			req.Header[http.CanonicalHeaderKey(h)] = v
		}
	}
	req.Header.Set("Accept", "application/json")
	s.cfg.ClusterSecret.Sign(req.Header, req.Method, req.URL.RequestURI(), principal, time.Now())
	return req, nil
}

// askPeer asks the replica at base for its part of r's listing.
func (s *Server) askPeer(ctx context.Context, base string, r *http.Request, keep []string, principal []byte) ([]json.RawMessage, bool) {
	req, err := s.peerRequest(ctx, base, r, keep, principal)
	if err != nil {
		return nil, false
	}
	resp, err := s.peers.Do(req)
	if err != nil {
		s.log.Info("listing: a replica did not answer; its part is read from the store", "replica", base, "err", err)
		return nil, false
	}
	defer resp.Body.Close()
	var items []json.RawMessage
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, s.cfg.MaxBodyBytes)).Decode(&items) != nil {
		s.log.Info("listing: a replica's part is read from the store", "replica", base, "status", resp.StatusCode)
		return nil, false
	}
	return items, true
}

// merged is this replica's own items of a listing followed by the other
// replicas' parts, and for those that did not answer, their entries of
// the store (stored reads them, only then). An id listed once is not
// listed again.
func (s *Server) merged(c echo.Context, own []json.RawMessage, idKey string, keep []string,
	stored func(*StoredListing) []Listed) []json.RawMessage {
	p, _ := c.Get(principalKey).(principal)
	return s.mergedFor(c.Request(), encodePrincipal(p), own, idKey, keep, stored)
}

// mergedFor is merged for the request r (a GET of a listing), signed
// for principal.
func (s *Server) mergedFor(r *http.Request, principal []byte, own []json.RawMessage, idKey string, keep []string,
	stored func(*StoredListing) []Listed) []json.RawMessage {
	parts := s.peerPartsFor(r, principal, keep)
	seen := make(map[string]bool, len(own))
	out := own
	for _, it := range own {
		seen[itemID(it, idKey)] = true
	}
	var missing []string
	for _, p := range parts {
		if !p.ok {
			missing = append(missing, p.url)
			continue
		}
		for _, it := range p.items {
			if id := itemID(it, idKey); !seen[id] {
				seen[id] = true
				out = append(out, it)
			}
		}
	}
	if len(missing) == 0 {
		return out
	}
	ctx, cancel := context.WithTimeout(r.Context(), listTimeout)
	defer cancel()
	l, err := s.cluster.Stored(ctx)
	if err != nil {
		s.log.Warn("listing: the store could not be read for the replicas that did not answer", "replicas", missing, "err", err)
		return out
	}
	for _, e := range stored(l) {
		if seen[e.ID] || !slices.Contains(missing, e.Replica) {
			continue
		}
		js, err := json.Marshal(e.Model)
		if err != nil {
			continue
		}
		seen[e.ID] = true
		out = append(out, js)
	}
	return out
}

// itemID is the id of a listed item, its field key.
func itemID(it json.RawMessage, key string) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(it, &m) != nil {
		return ""
	}
	var id string
	json.Unmarshal(m[key], &id)
	return id
}

// rawItems is a listing of this replica's as JSON items.
func rawItems[T any](models []T) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(models))
	for _, m := range models {
		js, _ := json.Marshal(m)
		out = append(out, js)
	}
	return out
}

// noHeaders: a listing sent to another replica leaves the caller's
// headers (its credentials) behind; the principal travels signed instead.
var noHeaders []string

// contextTokenPrefix begins every context token (tokenStore.mint).
const contextTokenPrefix = "kgc_"

func (s *Server) clusterKernels(c echo.Context) []json.RawMessage {
	ks := s.mgr.Kernels()
	own := make([]sessions.KernelModel, 0, len(ks))
	for _, k := range ks {
		own = append(own, k.Model())
	}
	return s.merged(c, rawItems(own), "id", noHeaders, func(l *StoredListing) []Listed { return l.Kernels })
}

func (s *Server) listClusterKernels(c echo.Context) error {
	return c.JSON(http.StatusOK, s.clusterKernels(c))
}

func (s *Server) listClusterContexts(c echo.Context) error {
	cs := s.mgr.Contexts()
	own := make([]sessions.ContextModel, 0, len(cs))
	for _, ctx := range cs {
		own = append(own, ctx.Model())
	}
	return c.JSON(http.StatusOK, s.merged(c, rawItems(own), "id", noHeaders, func(l *StoredListing) []Listed { return l.Contexts }))
}

// mcpContexts is MCP's list_contexts among replicas: own, this
// replica's contexts, followed by the other replicas' (as GET
// /api/contexts lists them). A context token's call (which lists its
// own context, on the replica that owns it) gets own.
func (s *Server) mcpContexts(ctx context.Context, a mcp.Access, own []json.RawMessage) []json.RawMessage {
	if s.cluster == nil || a.Context != "" {
		return own
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodGet, s.BaseURL()+"api/contexts", nil)
	if err != nil {
		return own
	}
	p := principal{name: "mcp", scopes: ScopeRead}
	return s.mergedFor(r, encodePrincipal(p), own, "id", noHeaders, func(l *StoredListing) []Listed { return l.Contexts })
}

func (s *Server) listClusterSessions(c echo.Context) error {
	own := rawItems(s.mgr.JupyterSessions().List())
	return c.JSON(http.StatusOK, s.merged(c, own, "id", noHeaders, func(l *StoredListing) []Listed { return l.Sessions }))
}

// clusterStatus is the status with the cluster's counts: its kernels,
// their connections and their latest activity.
func (s *Server) clusterStatus(c echo.Context) error {
	st := s.mgr.Status()
	// The listing of kernels is asked for: a status of another replica
	// would not say which kernels it counted.
	r := c.Request()
	kr := r.Clone(r.Context())
	kr.URL.Path, kr.URL.RawPath, kr.URL.RawQuery = strings.TrimSuffix(r.URL.Path, "/status")+"/kernels", "", ""
	c.SetRequest(kr)
	ks := s.clusterKernels(c)
	c.SetRequest(r)
	last, _ := timefmt.Parse(st.LastActivity)
	st.Kernels, st.Connections = len(ks), 0
	for _, it := range ks {
		var km sessions.KernelModel
		if json.Unmarshal(it, &km) != nil {
			continue
		}
		st.Connections += km.Connections
		if t, err := timefmt.Parse(km.LastActivity); err == nil && t.After(last) {
			last = t
		}
	}
	st.LastActivity = timefmt.Format(last)
	return c.JSON(http.StatusOK, st)
}

// e2bListing says whether c is the E2B endpoint's listing of sandboxes.
func (s *Server) e2bListing(c echo.Context) bool {
	if !s.clustered(c) || c.Request().Method != http.MethodGet {
		return false
	}
	p := c.Param("*")
	return p == "sandboxes" || p == "v2/sandboxes"
}

// e2bHeaders are the headers of an E2B listing another replica's E2B
// handler checks itself.
var e2bHeaders = []string{"X-API-KEY", "Authorization", "E2b-Sandbox-Id"}

// listClusterSandboxes is the E2B listing of sandboxes: this replica's
// answer (also when it is a refusal), with the others' sandboxes.
func (s *Server) listClusterSandboxes(c echo.Context, h http.Handler) error {
	rec := &recorder{header: http.Header{}, status: http.StatusOK}
	h.ServeHTTP(rec, c.Request())
	var own []json.RawMessage
	if rec.status != http.StatusOK || json.Unmarshal(rec.body.Bytes(), &own) != nil {
		for k, v := range rec.header {
			c.Response().Header()[k] = v
		}
		c.Response().WriteHeader(rec.status)
		_, err := c.Response().Write(rec.body.Bytes())
		return err
	}
	return c.JSON(http.StatusOK, s.merged(c, own, "sandboxID", e2bHeaders, func(l *StoredListing) []Listed { return l.Sandboxes }))
}

// recorder keeps a handler's answer.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) WriteHeader(status int)      { r.status = status }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }

// clusterToken finds a context token another replica minted, in the
// store (every use: a token revoked or deleted anywhere is refused at
// once). Only tokens of a context token's form are looked up.
func (s *Server) clusterToken(ctx context.Context, tok string) (p principal, ok, expired bool) {
	if s.cluster == nil || !strings.HasPrefix(tok, contextTokenPrefix) || len(tok) != len(contextTokenPrefix)+64 {
		return principal{}, false, false
	}
	ctx, cancel := context.WithTimeout(ctx, tokenTimeout)
	defer cancel()
	t, found, err := s.cluster.ContextToken(ctx, sha256.Sum256([]byte(tok)))
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			s.log.Warn("a context token could not be looked up in the store", "err", err)
		}
		return principal{}, false, false
	}
	if !found {
		return principal{}, false, false
	}
	if time.Now().After(t.Expires) {
		return principal{}, false, true
	}
	return principal{name: "context-token", scopes: allScopes, context: t.Context, contextCreated: t.ContextCreated}, true, false
}

// revokeOnPeers sends c's revocation of every context token to every
// other live replica, each revoking those of the contexts it owns, and
// returns the replicas that did not confirm it.
func (s *Server) revokeOnPeers(c echo.Context) (missed []string) {
	self := s.cluster.Self()
	r := c.Request()
	p, _ := c.Get(principalKey).(principal)
	principal := encodePrincipal(p)
	ctx, cancel := context.WithTimeout(r.Context(), listTimeout)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, u := range s.cluster.Replicas() {
		if u == self {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok := false
			if req, err := s.peerRequest(ctx, u, r, noHeaders, principal); err == nil {
				if resp, err := s.peers.Do(req); err == nil {
					io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
					resp.Body.Close()
					ok = resp.StatusCode == http.StatusNoContent
				}
			}
			if !ok {
				mu.Lock()
				missed = append(missed, u)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.Sort(missed)
	return missed
}

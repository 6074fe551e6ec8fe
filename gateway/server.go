package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"kernelgate/e2b"
	"kernelgate/forward"
	"kernelgate/internal/rawio"
	"kernelgate/sessions"
)

// Version is what GET /api reports: the jupyter_server API version
// kernelgate is compatible with.
const Version = "2.14.2"

// Config is the gateway's HTTP configuration.
type Config struct {
	// Token, when set, is required on every route but /api.
	Token string
	// AllowOrigins lists the exact origins (scheme://host[:port]) allowed
	// for CORS and websocket upgrades besides the gateway's own; "*"
	// allows any.
	AllowOrigins []string
	// BaseURL is the path prefix the gateway is served under ("/").
	BaseURL string
	// MaxBodyBytes bounds request bodies; MaxFrameBytes websocket frames.
	MaxBodyBytes  int64
	MaxFrameBytes int64
	// MaxUploadBytes bounds a file uploaded into a workspace.
	MaxUploadBytes int64
	// PingInterval is how often websockets are pinged.
	PingInterval time.Duration
	// APIKeys are keys with scopes, besides the token (which has all).
	APIKeys []APIKey
	// MaxContextTokenTTL bounds the life of context tokens.
	MaxContextTokenTTL time.Duration
	// ProductVersion is kernelgate's own version.
	ProductVersion string
	// Web serves the browser front-end at the base URL (optional).
	Web http.Handler
	// Metrics, when set, are served at /metrics (shared with the manager
	// as its Observer); MetricsOpen serves them without credentials.
	Metrics     *Metrics
	MetricsOpen bool
	// Owners, when set, says which replica owns what a request addresses;
	// requests for what another replica owns are forwarded to it, signed
	// with ClusterSecret (replicas.go). Nil: one gateway, nothing
	// forwarded.
	Owners Owners
	// ClusterSecret authenticates replicas to each other
	// (--cluster-secret-file, KERNELGATE_CLUSTER_SECRET): it signs the
	// requests this replica forwards and checks those it receives.
	ClusterSecret *forward.Secret
	// Cluster, set with Owners, is what this replica reads of the others
	// in the store: the listings are then the cluster's and context
	// tokens minted by any replica work here (replicas_list.go).
	Cluster Cluster

	testLogger *slog.Logger // tests capture the logs here
}

// DefaultConfig returns the defaults fill gives what a Config leaves
// zero (kernelgate's flags show them).
func DefaultConfig() Config {
	return Config{
		BaseURL:            "/",
		MaxBodyBytes:       16 << 20,
		MaxUploadBytes:     1 << 30,
		MaxFrameBytes:      64 << 20,
		PingInterval:       30 * time.Second,
		MaxContextTokenTTL: 24 * time.Hour,
	}
}

func (c *Config) fill() {
	d := DefaultConfig()
	if c.BaseURL == "" {
		c.BaseURL = d.BaseURL
	}
	if !strings.HasPrefix(c.BaseURL, "/") {
		c.BaseURL = "/" + c.BaseURL
	}
	if !strings.HasSuffix(c.BaseURL, "/") {
		c.BaseURL += "/"
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = d.MaxBodyBytes
	}
	if c.MaxUploadBytes <= 0 {
		c.MaxUploadBytes = d.MaxUploadBytes
	}
	if c.MaxFrameBytes <= 0 {
		c.MaxFrameBytes = d.MaxFrameBytes
	}
	if c.PingInterval <= 0 {
		c.PingInterval = d.PingInterval
	}
	if c.MaxContextTokenTTL <= 0 {
		c.MaxContextTokenTTL = d.MaxContextTokenTTL
	}
}

// Server is the HTTP side of kernelgate.
type Server struct {
	cfg     Config
	mgr     *sessions.Manager
	log     *slog.Logger
	echo    *echo.Echo
	http    *http.Server
	keys    []APIKey
	tokens  *tokenStore
	metrics *Metrics
	e2b     *e2b.Handler
	owners  Owners         // nil: one gateway
	proxy   *forward.Proxy // to the other replicas, with owners
	cluster Cluster        // the others' records, with owners
	peers   *http.Client   // asks the others for their listings
	leases  Leases         // the owners' leases, when they tell them (nil: none)
	holders ownerCache     // contexts' owners, for forwarded runs (replicas_cache.go)

	mu     sync.Mutex
	conns  map[*wsConn]struct{}
	closed bool
	wg     sync.WaitGroup // websocket pumps

	connLogs sync.Map // net.Conn → *connLog: request lines waiting for their responses (logging.go)
}

// New builds the gateway's routes over mgr.
func New(cfg Config, mgr *sessions.Manager, log *slog.Logger) *Server {
	cfg.fill()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, mgr: mgr, log: log, conns: make(map[*wsConn]struct{}),
		keys: cfg.APIKeys, tokens: &tokenStore{tokens: map[[32]byte]contextToken{}}, metrics: cfg.Metrics}
	// The context tokens an earlier gateway minted, kept with their
	// contexts.
	for _, c := range mgr.Contexts() {
		for _, t := range c.Tokens() {
			s.tokens.tokens[t.Hash] = contextToken{context: c.ID, contextCreated: c.Created(), expires: t.Expires}
		}
	}
	if s.metrics == nil {
		s.metrics = NewMetrics()
	}
	s.metrics.reg.MustRegister(newStateCollector(s))
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.errorHandler
	e.Logger.SetOutput(discard{})
	s.echo = e
	s.setupReplicas()
	s.routes()
	// The E2B sandboxes an earlier gateway kept, over the contexts the
	// manager restored.
	if _, err := s.e2b.Restore(context.Background()); err != nil {
		log.Error("state: e2b sandboxes not restored", "err", err)
	}
	s.http = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		ConnContext:       s.connContext,
		ConnState:         s.connState,
	}
	return s
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// ServeHTTP serves one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.echo.ServeHTTP(w, r)
}

// Handler is the gateway as an http.Handler.
func (s *Server) Handler() http.Handler { return s }

// Serve accepts connections on l until Shutdown.
func (s *Server) Serve(l net.Listener) error {
	// Raw reads and writes keep the scheduler's monitor thread asleep
	// while messages pass (see internal/rawio).
	err := s.http.Serve(rawio.Listener{Listener: l})
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops accepting requests, closes every websocket and waits for
// the requests in flight (up to ctx).
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	conns := make([]*wsConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	err := s.http.Shutdown(ctx)
	s.e2b.Close()
	for _, c := range conns {
		c.closeGoingAway()
	}
	if s.proxy != nil {
		s.proxy.Close()
	}
	if s.peers != nil {
		s.peers.CloseIdleConnections()
	}
	s.wg.Wait()
	return err
}

// Close ends what Shutdown left in flight: it waits up to ctx for the
// requests still running (those whose kernels have been stopped since end
// soon), then closes their connections.
func (s *Server) Close(ctx context.Context) error {
	if err := s.http.Shutdown(ctx); err != nil {
		return s.http.Close()
	}
	return nil
}

func (s *Server) path(p string) string { return s.cfg.BaseURL + strings.TrimPrefix(p, "/") }

// tag marks the routes of a group with their error surface.
func tag(sf surface) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			c.Set(surfaceKey, sf)
			return next(c)
		}
	}
}

func (s *Server) routes() {
	e := s.echo
	e.Pre(s.trimTrailingSlash)
	e.Use(s.logRequests, s.closeWhileLeaving, s.securityHeaders, s.cors, s.guardBrowsers)
	base := e.Group(strings.TrimSuffix(s.cfg.BaseURL, "/"))

	read, exec := s.need(ScopeRead, false), s.need(ScopeExec, false)
	ctxRead, ctxExec := s.need(ScopeRead, true), s.need(ScopeExec, true)
	// What a route addresses, forwarded to the replica that owns it
	// (replicas.go); with one gateway these add nothing.
	byKernel, bySession := s.owned(KindKernel, "id"), s.owned(KindSession, "id")
	byContext, byRun := s.owned(KindContext, "id"), s.owned(KindRun, "id")

	// Operations: probes without credentials, metrics with read unless open.
	ops := base.Group("", tag(anySurface))
	ops.GET("/healthz", s.healthz)
	ops.GET("/readyz", s.readyz)
	if s.cfg.MetricsOpen {
		ops.GET("/metrics", s.metricsHandler())
	} else {
		ops.GET("/metrics", s.metricsHandler(), s.authenticate, read)
	}
	ops.GET("/api/openapi.json", s.getOpenAPI)

	// Jupyter Server compatible surface.
	j := base.Group("", tag(jupyterSurface))
	j.GET("/api", s.getAPI)
	ja := base.Group("", tag(jupyterSurface), s.authenticate)
	ja.GET("/api/status", s.getStatus, read)
	ja.GET("/api/kernelspecs", s.listKernelspecs, read)
	ja.GET("/api/kernelspecs/:name", s.getKernelspec, read)
	ja.GET("/kernelspecs/:name/*", s.getKernelspecResource, read)
	ja.HEAD("/kernelspecs/:name/*", s.getKernelspecResource, read)
	ja.GET("/api/kernels", s.listKernels, read)
	ja.POST("/api/kernels", s.startKernel, exec)
	ja.GET("/api/kernels/:id", s.getKernel, read, byKernel)
	ja.DELETE("/api/kernels/:id", s.deleteKernel, exec, byKernel)
	ja.POST("/api/kernels/:id/interrupt", s.interruptKernel, exec, byKernel)
	ja.POST("/api/kernels/:id/restart", s.restartKernel, exec, byKernel)
	ja.GET("/api/kernels/:id/channels", s.channels, ctxExec, byKernel)
	ja.GET("/api/sessions", s.listSessions, read)
	ja.POST("/api/sessions", s.createSession, exec, s.ownedInBody(KindKernel, sessionKernel), s.ownedInBody(KindSession, s.sessionOfPath))
	ja.GET("/api/sessions/:id", s.getSession, read, bySession)
	ja.PATCH("/api/sessions/:id", s.updateSession, exec, bySession)
	ja.DELETE("/api/sessions/:id", s.deleteSession, exec, bySession)

	// Code-interpreter surface.
	ci := base.Group("", tag(apiSurface), s.authenticate)
	ci.POST("/api/execute", s.execute, ctxExec, s.ownedInBody(KindContext, s.executeContext))
	ci.POST("/api/contexts", s.createContext, exec)
	ci.GET("/api/contexts", s.listContexts, read)
	ci.GET("/api/contexts/:id", s.getContext, ctxRead, byContext)
	ci.DELETE("/api/contexts/:id", s.deleteContext, exec, byContext)
	ci.POST("/api/contexts/:id/interrupt", s.interruptContext, ctxExec, byContext)
	ci.POST("/api/contexts/:id/restart", s.restartContext, ctxExec, byContext)
	ci.POST("/api/contexts/:id/tokens", s.mintContextToken, exec, byContext)
	ci.DELETE("/api/contexts/:id/tokens", s.revokeContextTokens, exec, byContext)
	ci.DELETE("/api/context-tokens", s.revokeAllContextTokens, exec)
	ci.GET("/api/runs/:id", s.getRun, ctxRead, byRun)
	ci.GET("/api/runs/:id/events", s.runEvents, ctxRead, byRun)
	ci.POST("/api/runs/:id/interrupt", s.interruptRun, ctxExec, byRun)
	ci.POST("/api/runs/:id/input", s.inputRun, ctxExec, byRun)
	ci.POST("/api/runs/:id/kill", s.killRun, ctxExec, byRun)
	ci.POST("/api/contexts/:id/commands", s.runCommand, ctxExec, byContext)
	ci.GET("/api/languages", s.listLanguages, read)
	ci.GET("/api/contexts/:id/files", s.listFiles, ctxRead, byContext)
	ci.GET("/api/contexts/:id/files/*", s.getFile, ctxRead, byContext)
	ci.HEAD("/api/contexts/:id/files/*", s.getFile, ctxRead, byContext)
	ci.PUT("/api/contexts/:id/files/*", s.putFile, ctxExec, byContext)
	ci.DELETE("/api/contexts/:id/files/*", s.deleteFile, ctxExec, byContext)

	// Agents: MCP over Streamable HTTP, with the API's credentials.
	ag := base.Group("", tag(apiSurface), s.authenticate)
	// The transport is stateless: no session to GET a stream of or DELETE.
	ag.POST("/mcp", echo.WrapHandler(s.mcpHandler()), s.ownedInBody(KindContext, s.mcpContext))
	// E2B's SDK: its own headers, checked by the handler.
	s.e2b = s.e2bHandler()
	e2bPrefix := strings.TrimSuffix(s.cfg.BaseURL, "/") + "/e2b"
	// The E2B handler writes through download, so that a file it sends
	// goes out with sendfile as the files API's do.
	e2bStrip := http.StripPrefix(e2bPrefix, s.e2b)
	e2bH := func(c echo.Context) error {
		if s.e2bListing(c) {
			return s.listClusterSandboxes(c, e2bStrip)
		}
		e2bStrip.ServeHTTP(download{c.Response()}, c.Request())
		return nil
	}
	base.Any("/e2b/*", e2bH, tag(apiSurface), s.e2bFromReplica, s.ownedBy(KindSandbox, s.e2bSandbox))

	if s.cfg.Web != nil {
		w := echo.WrapHandler(http.StripPrefix(strings.TrimSuffix(s.cfg.BaseURL, "/"), s.cfg.Web))
		base.GET("/", w)
		base.GET("/static/*", w)
	}
}

// trimTrailingSlash routes /api/kernels/ like /api/kernels.
func (s *Server) trimTrailingSlash(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if p := r.URL.Path; len(p) > 1 && strings.HasSuffix(p, "/") && p != s.cfg.BaseURL {
			r.URL.Path = strings.TrimRight(p, "/")
			if r.URL.RawPath != "" {
				r.URL.RawPath = strings.TrimRight(r.URL.RawPath, "/")
			}
		}
		return next(c)
	}
}

// securityHeaders are sent on every response.
func (s *Server) securityHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		return next(c)
	}
}

// BaseURL is the path prefix the gateway serves under, with a trailing slash.
func (s *Server) BaseURL() string { return s.cfg.BaseURL }

// Package e2b serves what E2B's code-interpreter SDK (@e2b/code-interpreter
// 2.x, and the e2b SDK under it) calls, so that the unmodified SDK runs
// code on kernelgate when its apiUrl and sandboxUrl both point at the
// handler (http://host:port/e2b):
//
//   - the sandbox API (E2B's control plane): create, get, list, connect,
//     set timeout and kill, authenticated with X-API-KEY;
//   - the code-interpreter server of a sandbox: /execute with E2B's NDJSON
//     events, /contexts, /health;
//   - the sandbox's files (envd's /files and filesystem RPCs), in a
//     workspace the sandbox's contexts share as their working directory;
//   - its commands (envd's process RPCs), run beside its default
//     context's kernel (process.go).
//
// A sandbox is a set of contexts of the sessions manager with ids
// "e2b-<sandbox>-<name>": its default ones (one per language, made on first
// use; python at create) and those the SDK creates. Requests to a sandbox
// name it in the E2b-Sandbox-Id header and carry its access token (the
// envdAccessToken and trafficAccessToken of create, one secret): a
// credential for that sandbox alone. Killing a sandbox, or its timeout
// running out, deletes every context it has, and with them their kernels.
//
// With the manager's state store, a sandbox is kept there too (its id,
// template, metadata, token hashes and end) and comes back, with its
// contexts, when a gateway starts again on that store (persist.go).
//
// It is an http.Handler built on sessions.Manager, mounted by the gateway;
// it never reaches past sessions.
package e2b

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"kernelgate/internal/seconds"
	"kernelgate/internal/timefmt"
	"kernelgate/sessions"
	"kernelgate/state"
	"kernelgate/workspace"
)

// Access is what an X-API-KEY may do on the sandbox API.
type Access struct {
	Read, Exec bool
}

// Config configures the handler.
type Config struct {
	// Authorize maps an X-API-KEY to what it may do; an error refuses it
	// (its status from Describe).
	Authorize func(apiKey string) (Access, error)
	// Describe gives an error's status and message.
	Describe func(err error) (status int, message string)
	// DefaultTimeout is a sandbox's life when create names none (E2B's
	// default, 5 minutes); MaxTimeout bounds any (24 hours, E2B's longest):
	// a longer one is refused, 400, as E2B refuses it.
	DefaultTimeout, MaxTimeout time.Duration
	// MaxBodyBytes bounds a request's JSON body; MaxUploadBytes a file
	// written into a sandbox (0: no limit).
	MaxBodyBytes   int64
	MaxUploadBytes int64
	Logger         *slog.Logger
	// Owned, set when replicas share one database, says whether this
	// replica acts for the sandbox (it owns the kernel of the sandbox's
	// default context). A sandbox it does not own is neither timed out
	// nor dropped by Restore here: its owner does both. nil (one
	// gateway): every sandbox is this process's.
	Owned func(ctx context.Context, sandboxID string) (bool, error)
}

// envdVersion is the envd version sandboxes report: the SDK picks its wire
// formats by it (multipart uploads, user-less requests from 0.4.0 on).
const envdVersion = "0.5.7"

// Handler serves the E2B-compatible endpoint.
type Handler struct {
	cfg Config
	mgr *sessions.Manager
	mux *http.ServeMux
	// store keeps the sandboxes for the next start (the manager's; nil:
	// memory only).
	store state.Store

	// procs are the sandboxes' commands (process.go).
	procs processTable

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	closed    bool

	takeovers takeovers // among replicas (takeover.go)
}

// sandbox is one sandbox: an id, access tokens and a life.
type sandbox struct {
	id       string
	template string
	metadata map[string]string
	started  time.Time
	ws       *workspace.Workspace // the sandbox's files, its contexts' cwd

	// guarded by Handler.mu
	// token is handed on connect: the token of create, or after a
	// restart (which kept only its hash) one a connect minted.
	token  string
	hashes [][32]byte // of the tokens that open it
	end    time.Time
	timer  *time.Timer
	gone   bool // killed: its record is not written again
	rec    recordWrites
}

// New builds the handler over mgr.
func New(cfg Config, mgr *sessions.Manager) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = 5 * time.Minute
	}
	if cfg.MaxTimeout <= 0 {
		cfg.MaxTimeout = 24 * time.Hour
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 16 << 20
	}
	if cfg.Describe == nil {
		cfg.Describe = func(err error) (int, string) { return http.StatusInternalServerError, err.Error() }
	}
	if cfg.Authorize == nil {
		cfg.Authorize = func(string) (Access, error) { return Access{Read: true, Exec: true}, nil }
	}
	h := &Handler{cfg: cfg, mgr: mgr, mux: http.NewServeMux(), store: mgr.Store(), sandboxes: map[string]*sandbox{}}
	h.takeovers.killing = map[string]bool{}
	h.routes()
	if cfg.Owned != nil && h.store != nil {
		h.takeovers.stop, h.takeovers.done = make(chan struct{}), make(chan struct{})
		go h.watchTakeovers()
	}
	return h
}

func (h *Handler) routes() {
	m := h.mux
	// The sandbox API.
	for _, p := range []string{"/sandboxes", "/v2/sandboxes"} {
		m.HandleFunc("POST "+p, h.api(true, h.createSandbox))
		m.HandleFunc("GET "+p, h.api(false, h.listSandboxes))
		m.HandleFunc("GET "+p+"/{id}", h.api(false, h.getSandbox))
		m.HandleFunc("DELETE "+p+"/{id}", h.api(true, h.killSandbox))
		m.HandleFunc("POST "+p+"/{id}/connect", h.api(true, h.connectSandbox))
		m.HandleFunc("POST "+p+"/{id}/timeout", h.api(true, h.setTimeout))
		m.HandleFunc("POST "+p+"/{id}/refreshes", h.api(true, h.refresh))
	}
	// The code-interpreter server of a sandbox.
	m.HandleFunc("GET /health", h.health)
	m.HandleFunc("POST /execute", h.inSandbox(h.execute))
	m.HandleFunc("POST /contexts", h.inSandbox(h.createContext))
	m.HandleFunc("GET /contexts", h.inSandbox(h.listContexts))
	m.HandleFunc("DELETE /contexts/{id}", h.inSandbox(h.deleteContext))
	m.HandleFunc("POST /contexts/{id}/restart", h.inSandbox(h.restartContext))
	// envd: files (and commands) of a sandbox.
	m.HandleFunc("GET /files", h.inSandbox(h.getFile))
	m.HandleFunc("POST /files", h.inSandbox(h.postFile))
	m.HandleFunc("/filesystem.Filesystem/{method}", h.inSandbox(h.filesystemRPC))
	m.HandleFunc("/process.Process/{method}", h.inSandbox(h.processRPC))
}

// ServeHTTP serves one request; the path is relative to the mount point.
// Every route but /health needs E2B's credentials: a request with none is
// refused before routing.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/health" && r.Header.Get("X-API-KEY") == "" &&
		r.Header.Get("X-Access-Token") == "" && r.Header.Get("E2B-Traffic-Access-Token") == "" {
		apiError(w, http.StatusUnauthorized, "credentials required: X-API-KEY (a kernelgate token or API key) for the sandbox API, the sandbox's access token for the rest")
		return
	}
	h.mux.ServeHTTP(w, r)
}

// Close refuses new sandboxes. Without a store it kills every sandbox
// (their contexts and files: a restarted gateway would not know them);
// with one it only stops their timers, and they are there at the next
// start, as the contexts are.
func (h *Handler) Close() {
	h.stopTakeovers()
	h.mu.Lock()
	h.closed = true
	ids := make([]string, 0, len(h.sandboxes))
	for id, sb := range h.sandboxes {
		ids = append(ids, id)
		if sb.timer != nil {
			sb.timer.Stop()
		}
	}
	h.mu.Unlock()
	if h.store != nil {
		return
	}
	for _, id := range ids {
		h.kill(id)
	}
}

// apiError writes an error of the sandbox API: {"code","message"}.
func apiError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// textError writes an error of the sandbox's own servers: plain text, as
// E2B's code-interpreter server answers.
func textError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	w.Write([]byte(msg))
}

// api guards a route of the sandbox API with X-API-KEY.
func (h *Handler) api(exec bool, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-KEY")
		if key == "" {
			apiError(w, http.StatusUnauthorized, "X-API-KEY is required: a kernelgate token or API key")
			return
		}
		a, err := h.cfg.Authorize(key)
		if err != nil {
			status, msg := h.cfg.Describe(err)
			apiError(w, status, msg)
			return
		}
		if exec && !a.Exec || !exec && !a.Read && !a.Exec {
			scope := "read"
			if exec {
				scope = "exec"
			}
			apiError(w, http.StatusForbidden, "this key lacks the "+scope+" scope")
			return
		}
		next(w, r)
	}
}

// inSandbox guards a route of a sandbox's servers: the sandbox named by
// E2b-Sandbox-Id, with its access token.
func (h *Handler) inSandbox(next func(http.ResponseWriter, *http.Request, *sandbox)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("E2b-Sandbox-Id")
		if id == "" {
			textError(w, http.StatusBadRequest, "E2b-Sandbox-Id is required: the id of a sandbox made with POST /e2b/sandboxes")
			return
		}
		sb := h.sandbox(id)
		if sb == nil {
			// E2B answers 502 for a sandbox that is gone; the SDK tells
			// its user the sandbox was killed or timed out.
			textError(w, http.StatusBadGateway, "sandbox "+id+" not found: it was killed or its timeout ran out")
			return
		}
		tok := r.Header.Get("X-Access-Token")
		if tok == "" {
			tok = r.Header.Get("E2B-Traffic-Access-Token")
		}
		if tok == "" || !h.opens(sb, tok) {
			textError(w, http.StatusUnauthorized, "the sandbox's access token is required (X-Access-Token or E2B-Traffic-Access-Token)")
			return
		}
		next(w, r, sb)
	}
}

// opens says tok is one of the sandbox's access tokens.
func (h *Handler) opens(sb *sandbox, tok string) bool {
	th := sha256.Sum256([]byte(tok))
	h.mu.Lock()
	defer h.mu.Unlock()
	ok := 0
	for _, hash := range sb.hashes {
		ok |= subtle.ConstantTimeCompare(th[:], hash[:])
	}
	return ok == 1
}

func (h *Handler) sandbox(id string) *sandbox {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sandboxes[id]
}

// newSecret returns n random bytes in hex.
func newSecret(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// decode reads a JSON body (an empty one is {}).
func (h *Handler) decode(r *http.Request, v any) error {
	body := http.MaxBytesReader(nil, r.Body, h.cfg.MaxBodyBytes)
	d := json.NewDecoder(body)
	if err := d.Decode(v); err != nil && !errors.Is(err, io.EOF) { // io.EOF: no body
		return err
	}
	return nil
}

// createBody is POST /sandboxes.
type createBody struct {
	TemplateID string            `json:"templateID"`
	Timeout    *float64          `json:"timeout"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
}

// sandboxModel is a sandbox as the sandbox API shows it.
func (h *Handler) sandboxModel(sb *sandbox, withTokens bool) map[string]any {
	h.mu.Lock()
	end, token := sb.end, sb.token
	h.mu.Unlock()
	// What its Python kernel, made at create, may use.
	res, _ := h.mgr.Catalog().Resources("python")
	m := map[string]any{
		"sandboxID": sb.id, "templateID": sb.template, "alias": sb.template, "clientID": "kernelgate",
		"envdVersion": envdVersion, "startedAt": timefmt.Format(sb.started), "endAt": timefmt.Format(end),
		"state": "running", "cpuCount": res.CPUs, "memoryMB": res.MemoryBytes >> 20, "diskSizeMB": 0, "metadata": nonNil(sb.metadata),
	}
	if withTokens {
		m["envdAccessToken"] = token
		m["trafficAccessToken"] = token
		m["domain"] = nil
	}
	return m
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// timeoutOf reads a timeout in seconds: absent or 0 is the default, one
// past MaxTimeout is refused (as E2B refuses it: "Timeout cannot be
// greater than 24 hours"). The number is bounded before it becomes a
// duration: seconds past 292 years would wrap to an end in the past.
func (h *Handler) timeoutOf(t *float64) (time.Duration, error) {
	if t == nil {
		return h.cfg.DefaultTimeout, nil
	}
	if *t < 0 {
		return 0, fmt.Errorf("timeout is a number of seconds from 0 to %s", seconds.Format(h.cfg.MaxTimeout))
	}
	d, ok := seconds.Of(*t, h.cfg.MaxTimeout)
	if !ok {
		return 0, fmt.Errorf("Timeout cannot be greater than %s", spell(h.cfg.MaxTimeout))
	}
	if d == 0 {
		d = h.cfg.DefaultTimeout
	}
	return d, nil
}

// spell says a bound as E2B's messages do: "24 hours", else seconds.
func spell(d time.Duration) string {
	if d%time.Hour == 0 {
		return fmt.Sprintf("%d hours", d/time.Hour)
	}
	return seconds.Format(d) + " seconds"
}

// maxRefresh bounds a refresh's duration (E2B's API: 0 to 3600 seconds).
const maxRefresh = time.Hour

func (h *Handler) createSandbox(w http.ResponseWriter, r *http.Request) {
	var body createBody
	if err := h.decode(r, &body); err != nil {
		apiError(w, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	if len(body.EnvVars) > 0 {
		apiError(w, http.StatusBadRequest, "envs are not supported: kernels start with the gateway's environment (set variables in code)")
		return
	}
	life, err := h.timeoutOf(body.Timeout)
	if err != nil {
		apiError(w, http.StatusBadRequest, err.Error())
		return
	}
	tok := "kgs_" + newSecret(32)
	sb := &sandbox{id: "kg" + newSecret(idBytes), template: body.TemplateID, token: tok, hashes: [][32]byte{sha256.Sum256([]byte(tok))},
		metadata: body.Metadata, started: time.Now()}
	if sb.template == "" {
		sb.template = "code-interpreter-v1"
	}
	ws, err := h.mgr.CreateWorkspace("sandboxes/"+sb.id, h.workspaceLanguage())
	if err != nil {
		status, msg := h.cfg.Describe(err)
		apiError(w, status, msg)
		return
	}
	sb.ws = ws
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		ws.Delete()
		apiError(w, http.StatusServiceUnavailable, "the gateway is shutting down")
		return
	}
	h.sandboxes[sb.id] = sb
	sb.end = time.Now().Add(life) // armed once the sandbox is there
	h.mu.Unlock()
	// The default Python context starts now, as E2B's sandbox starts its
	// kernel: the first runCode finds it ready.
	if _, err := h.defaultContext(r.Context(), sb, "python"); err != nil {
		h.kill(sb.id)
		status, msg := h.cfg.Describe(err)
		apiError(w, status, msg)
		return
	}
	// The timeout counts from the answer: a kernel slower to start than
	// a short timeout must not kill the sandbox before it was created.
	h.mu.Lock()
	h.setLifeLocked(sb, life) // a change: the record is written below
	h.mu.Unlock()
	h.save(sb)
	h.cfg.Logger.Info("e2b sandbox created", "sandbox", sb.id)
	writeJSON(w, http.StatusCreated, h.sandboxModel(sb, true))
}

// setLifeLocked (re)arms the sandbox's timeout, a change of its record;
// h.mu is held.
func (h *Handler) setLifeLocked(sb *sandbox, life time.Duration) {
	sb.end = time.Now().Add(life)
	sb.rec.changes++
	h.armLocked(sb)
}

// armLocked sets the sandbox's timer to kill it at its end (not once it
// is killed); h.mu is held.
func (h *Handler) armLocked(sb *sandbox) {
	if sb.timer != nil {
		sb.timer.Stop()
	}
	if sb.gone {
		return
	}
	sb.timer = time.AfterFunc(time.Until(sb.end), func() { h.expire(sb) })
}

// expire kills the sandbox if its end has come (a timeout set again since
// the timer fired moved it).
func (h *Handler) expire(sb *sandbox) {
	h.mu.Lock()
	due := h.sandboxes[sb.id] == sb && !time.Now().Before(sb.end)
	h.mu.Unlock()
	if !due {
		return
	}
	switch owned, err := h.owned(context.Background(), sb.id); {
	case err != nil:
		// Asked again shortly: a sandbox is killed by its owner only.
		h.cfg.Logger.Warn("e2b sandbox timed out, its owner unknown: asked again", "sandbox", sb.id, "err", err)
		h.mu.Lock()
		if h.sandboxes[sb.id] == sb && !sb.gone {
			sb.timer = time.AfterFunc(ownerRetry, func() { h.expire(sb) })
		}
		h.mu.Unlock()
	case !owned:
		// Forgotten here, nothing deleted: if its kernel comes back to
		// this replica, its record is read afresh (takeover.go).
		h.mu.Lock()
		if h.sandboxes[sb.id] == sb {
			delete(h.sandboxes, sb.id)
		}
		h.mu.Unlock()
		h.cfg.Logger.Info("e2b sandbox timed out: left to the replica that owns it", "sandbox", sb.id)
	default:
		h.cfg.Logger.Info("e2b sandbox timed out", "sandbox", sb.id)
		h.kill(sb.id)
	}
}

// ownerRetry is how soon a timeout whose sandbox's owner could not be
// found is tried again.
const ownerRetry = 5 * time.Second

// owned says whether this process acts for the sandbox (Config.Owned;
// always without replicas).
func (h *Handler) owned(ctx context.Context, id string) (bool, error) {
	if h.cfg.Owned == nil {
		return true, nil
	}
	return h.cfg.Owned(ctx, id)
}

func (h *Handler) listSandboxes(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	sbs := make([]*sandbox, 0, len(h.sandboxes))
	for _, sb := range h.sandboxes {
		sbs = append(sbs, sb)
	}
	h.mu.Unlock()
	out := make([]map[string]any, 0, len(sbs))
	for _, sb := range sbs {
		out = append(out, h.sandboxModel(sb, false))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb := h.sandbox(r.PathValue("id"))
	if sb == nil {
		apiError(w, http.StatusNotFound, "sandbox "+r.PathValue("id")+" not found")
		return
	}
	writeJSON(w, http.StatusOK, h.sandboxModel(sb, false))
}

func (h *Handler) connectSandbox(w http.ResponseWriter, r *http.Request) {
	sb := h.sandbox(r.PathValue("id"))
	if sb == nil {
		apiError(w, http.StatusNotFound, "sandbox "+r.PathValue("id")+" not found")
		return
	}
	var body struct {
		Timeout *float64 `json:"timeout"`
	}
	if err := h.decode(r, &body); err != nil {
		apiError(w, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	var life time.Duration
	if body.Timeout != nil {
		var err error
		if life, err = h.timeoutOf(body.Timeout); err != nil {
			apiError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	h.mu.Lock()
	if body.Timeout != nil && time.Now().Add(life).After(sb.end) {
		h.setLifeLocked(sb, life)
	}
	if sb.token == "" {
		// Kept across a restart as a hash only: the connecting client
		// gets a token of its own; those handed before still open it.
		sb.token = "kgs_" + newSecret(32)
		sb.hashes = append(sb.hashes, sha256.Sum256([]byte(sb.token)))
		if len(sb.hashes) > maxTokens { // the one of create, and the newest
			sb.hashes = append(sb.hashes[:1], sb.hashes[len(sb.hashes)-maxTokens+1:]...)
		}
		sb.rec.changes++
	}
	h.mu.Unlock()
	// Its token's hash and its end are durable before they are handed
	// (also when a concurrent connect changed them).
	h.save(sb)
	writeJSON(w, http.StatusOK, h.sandboxModel(sb, true))
}

func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request) {
	sb := h.sandbox(r.PathValue("id"))
	if sb == nil {
		apiError(w, http.StatusNotFound, "sandbox "+r.PathValue("id")+" not found")
		return
	}
	var body struct {
		Timeout *float64 `json:"timeout"`
	}
	if err := h.decode(r, &body); err != nil || body.Timeout == nil {
		apiError(w, http.StatusBadRequest, "body: {\"timeout\": seconds}")
		return
	}
	life, err := h.timeoutOf(body.Timeout)
	if err != nil {
		apiError(w, http.StatusBadRequest, err.Error())
		return
	}
	h.mu.Lock()
	h.setLifeLocked(sb, life)
	h.mu.Unlock()
	h.save(sb)
	w.WriteHeader(http.StatusNoContent)
}

// refresh keeps the sandbox alive for at least duration seconds more
// (never shortening its timeout); without a duration it changes nothing.
func (h *Handler) refresh(w http.ResponseWriter, r *http.Request) {
	sb := h.sandbox(r.PathValue("id"))
	if sb == nil {
		apiError(w, http.StatusNotFound, "sandbox "+r.PathValue("id")+" not found")
		return
	}
	var body struct {
		Duration *float64 `json:"duration"`
	}
	if err := h.decode(r, &body); err != nil {
		apiError(w, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	if body.Duration == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	life, ok := seconds.Of(*body.Duration, min(maxRefresh, h.cfg.MaxTimeout))
	if !ok {
		apiError(w, http.StatusBadRequest, "duration is a number of seconds from 0 to "+seconds.Format(min(maxRefresh, h.cfg.MaxTimeout)))
		return
	}
	h.mu.Lock()
	longer := time.Now().Add(life).After(sb.end)
	if longer {
		h.setLifeLocked(sb, life)
	}
	h.mu.Unlock()
	if longer {
		h.save(sb)
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *Handler) killSandbox(w http.ResponseWriter, r *http.Request) {
	if !h.kill(r.PathValue("id")) {
		apiError(w, http.StatusNotFound, "sandbox "+r.PathValue("id")+" not found")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// kill forgets a sandbox, its record first, and deletes its contexts
// (their kernels with them) and files; false if there was no such
// sandbox.
func (h *Handler) kill(id string) bool {
	h.mu.Lock()
	sb, ok := h.sandboxes[id]
	var writing chan struct{}
	if ok {
		delete(h.sandboxes, id)
		if sb.timer != nil {
			sb.timer.Stop()
		}
		sb.gone = true
		writing = sb.rec.writing
		h.takeovers.killing[id] = true
	}
	h.mu.Unlock()
	if !ok {
		return false
	}
	defer func() {
		h.mu.Lock()
		delete(h.takeovers.killing, id)
		h.mu.Unlock()
	}()
	if writing != nil {
		<-writing // a write of its record under way ends before the delete
	}
	h.deleteRecord(id)
	h.deleteContexts(id)
	if err := sb.ws.Delete(); err != nil {
		h.cfg.Logger.Warn("e2b sandbox: workspace not deleted", "sandbox", id, "err", err)
	}
	h.cfg.Logger.Info("e2b sandbox killed", "sandbox", id)
	return true
}

// deleteContexts deletes the contexts of sandbox id.
func (h *Handler) deleteContexts(id string) {
	prefix := contextPrefix(id)
	for _, c := range h.mgr.Contexts() {
		if strings.HasPrefix(c.ID, prefix) {
			if err := h.mgr.DeleteContext(context.Background(), c.ID); err != nil && !errors.Is(err, sessions.ErrNoSuchContext) {
				h.cfg.Logger.Warn("e2b sandbox: context not deleted", "context", c.ID, "err", err)
			}
		}
	}
}

// workspaceLanguage is the language whose kernels' user owns a sandbox's
// files: python, else the first language served.
func (h *Handler) workspaceLanguage() string {
	langs := h.mgr.Catalog().Languages()
	for _, l := range langs {
		if l == "python" {
			return l
		}
	}
	if len(langs) > 0 {
		return langs[0]
	}
	return "python"
}

// health answers the SDK's isRunning: 502 for a sandbox that is gone, as
// E2B's proxy answers.
func (h *Handler) health(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" && h.sandbox(id) == nil {
		textError(w, http.StatusBadGateway, "sandbox "+id+" not found")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

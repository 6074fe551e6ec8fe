// Package mcp serves kernelgate's code interpreter as Model Context
// Protocol tools over the Streamable HTTP transport: running code in
// contexts whose state persists, managing those contexts, and the files of
// their workspaces.
//
// It is an http.Handler built on sessions.Manager, mounted by the gateway
// behind its authentication; it never reaches past sessions, and leaves
// the mapping of errors to codes to the gateway (Config.Describe). A
// context is named by a tool argument, never tied to the MCP session, so
// a client that reconnects, another client or a restarted gateway carries
// on with the same context. The transport is stateless: no MCP session is
// kept between requests.
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"kernelgate/sessions"
)

// Access is what the credentials of a request may do.
type Access struct {
	Read, Exec bool
	// Context, when set, is the one context these credentials reach (a
	// context token), made at ContextCreated: a context deleted and made
	// again under the same id is another one.
	Context        string
	ContextCreated time.Time
}

// ErrForbidden is returned when the credentials do not allow a call.
var ErrForbidden = errors.New("mcp: forbidden")

// FileInfo describes a file or folder of a context's workspace.
type FileInfo struct {
	Name     string    `json:"name"`
	Path     string    `json:"path"`
	Type     string    `json:"type"` // file, dir, symlink, fifo, socket, device or other
	Size     int64     `json:"size"`
	Modified time.Time `json:"modified"`
}

// Files is what the file tools need of a context's workspace. Paths are
// relative to the workspace; the implementation refuses any that leads
// out of it.
type Files interface {
	// Write stores the file atomically, making the folders above it.
	Write(ctx context.Context, contextID, path string, r io.Reader) (FileInfo, error)
	// Open opens the file for reading; the caller closes it. A file of
	// over max bytes is refused (ErrTooLarge of the workspace package),
	// its message saying where to get it instead. FileInfo.Size is the
	// file's size when opened.
	Open(ctx context.Context, contextID, path string, max int64) (io.ReadSeekCloser, FileInfo, error)
	// List lists the folder ("" for the workspace itself).
	List(ctx context.Context, contextID, path string) ([]FileInfo, error)
}

// Config configures the handler.
type Config struct {
	// Authorize maps the headers of a request to what it may do; the
	// gateway has already refused requests without valid credentials.
	Authorize func(h http.Header) (Access, error)
	// Describe names an error for a model: its code (SESSION_NOT_FOUND,
	// BAD_REQUEST, ...) and message.
	Describe func(err error) (code, message string)
	// ContextDeleted is told of each context a tool deleted.
	ContextDeleted func(id string)
	// Files serves the file tools; nil leaves them out.
	Files Files
	// MaxBodyBytes bounds a request's body.
	MaxBodyBytes int64
	// MaxReadBytes bounds the file read_file returns (default 8 MiB).
	MaxReadBytes int64
	// ReadBudgetBytes bounds what the answers of read_file calls in
	// flight hold at once, counted as their content's length in JSON (a
	// file's base64, or its text as a JSON string: up to six bytes a
	// byte); calls past it wait their turn, and a call larger than all of
	// it runs alone (default 3 × MaxReadBytes: two reads of text or
	// binary data at the limit).
	ReadBudgetBytes int64
	// Version is kernelgate's version, told to clients.
	Version string
	Logger  *slog.Logger
}

// Handler serves MCP.
type Handler struct {
	cfg   Config
	mgr   *sessions.Manager
	http  http.Handler
	reads *readBudget
}

// New builds the MCP handler over mgr.
func New(cfg Config, mgr *sessions.Manager) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxReadBytes <= 0 {
		cfg.MaxReadBytes = 8 << 20
	}
	if cfg.ReadBudgetBytes <= 0 {
		cfg.ReadBudgetBytes = 3 * cfg.MaxReadBytes
	}
	if cfg.Describe == nil {
		cfg.Describe = func(err error) (string, string) { return "ERROR", err.Error() }
	}
	if cfg.Authorize == nil {
		cfg.Authorize = func(http.Header) (Access, error) { return Access{Read: true, Exec: true}, nil }
	}
	h := &Handler{cfg: cfg, mgr: mgr, reads: newReadBudget(cfg.ReadBudgetBytes)}
	srv := sdk.NewServer(&sdk.Implementation{Name: "kernelgate", Title: "kernelgate code interpreter", Version: cfg.Version},
		&sdk.ServerOptions{Instructions: instructions})
	h.addTools(srv)
	h.http = sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, &sdk.StreamableHTTPOptions{
		Stateless:           true,
		MaxRequestBodyBytes: cfg.MaxBodyBytes,
		// The gateway guards Host and Origin itself (with its own
		// allowed origins and host rules).
		DisableLocalhostProtection: true,
		// A client that goes away (or cancels) interrupts its run.
		PropagateRequestCancellation: true,
	})
	return h
}

// ServeHTTP serves one MCP request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.reads.serve(w, r, h.http) }

const instructions = `kernelgate runs code in Jupyter kernels (Python with ipykernel; JavaScript and TypeScript on Deno).
Each context is one kernel whose state (variables, imports, functions, open files) persists across run_code calls until the context is deleted or restarted.
Create a context with create_context and pass its id to run_code; without a context, run_code uses the shared kernel of its language, which every caller of this gateway shares.
Results come back as text, plots (PNG or JPEG) as images, and the whole execution as structured content.`

// access returns the caller's access for a tool call.
func (h *Handler) access(req *sdk.CallToolRequest) (Access, error) {
	var hdr http.Header
	if req.Extra != nil {
		hdr = req.Extra.Header
	}
	return h.cfg.Authorize(hdr)
}

// check refuses a call the access does not allow: exec (or read) in
// general, and for a context token, any context but its own.
func (h *Handler) check(a Access, exec bool, contextID string) error {
	if exec && !a.Exec {
		return fmt.Errorf("%w: these credentials lack the exec scope", ErrForbidden)
	}
	if !exec && !a.Read && !a.Exec {
		return fmt.Errorf("%w: these credentials lack the read scope", ErrForbidden)
	}
	if a.Context == "" {
		return nil
	}
	if contextID != a.Context {
		return fmt.Errorf("%w: this context token is for context %s only", ErrForbidden, a.Context)
	}
	c, err := h.mgr.Context(contextID)
	if err != nil || !c.Created().Equal(a.ContextCreated) {
		return fmt.Errorf("%w: this context token was revoked with its context", ErrForbidden)
	}
	return nil
}

// toolError is a tool result saying why the call failed, with the code a
// model (or its user) can act on.
func (h *Handler) toolError(err error) *sdk.CallToolResult {
	var bad *badArgs
	code, msg := "FORBIDDEN", err.Error()
	switch {
	case errors.As(err, &bad):
		code = "BAD_REQUEST"
	case !errors.Is(err, ErrForbidden):
		code, msg = h.cfg.Describe(err)
	}
	return &sdk.CallToolResult{
		IsError: true,
		Content: []sdk.Content{&sdk.TextContent{Text: code + ": " + msg}},
	}
}

// badArgs is the error of arguments that do not decode.
type badArgs struct{ msg string }

func (e *badArgs) Error() string { return e.msg }

// decodeArgs decodes a tool's arguments strictly.
func decodeArgs(raw json.RawMessage, v any) error {
	if len(raw) == 0 || string(raw) == "null" {
		raw = json.RawMessage("{}")
	}
	d := json.NewDecoder(bytesReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return &badArgs{"arguments: " + err.Error()}
	}
	return nil
}

// jsonResult is a tool result with v as structured content and as text.
func jsonResult(text string, v any) (*sdk.CallToolResult, error) {
	js, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return &sdk.CallToolResult{
		Content:           []sdk.Content{&sdk.TextContent{Text: text}},
		StructuredContent: json.RawMessage(js),
	}, nil
}

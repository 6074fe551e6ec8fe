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
	"regexp"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
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
	// Contexts, when set, makes list_contexts' listing of what a's
	// caller may see of this gateway's own contexts (own, as
	// ContextModel JSON) the whole listing, own first: among replicas,
	// the others' contexts follow.
	Contexts func(ctx context.Context, a Access, own []json.RawMessage) []json.RawMessage
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
	cfg     Config
	mgr     *sessions.Manager
	server  *sdk.Server
	schemas map[string]*jsonschema.Schema // by tool name
	http    http.Handler
	reads   *readBudget
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
	h := &Handler{cfg: cfg, mgr: mgr, reads: newReadBudget(cfg.ReadBudgetBytes), schemas: map[string]*jsonschema.Schema{}}
	srv := sdk.NewServer(&sdk.Implementation{Name: "kernelgate", Title: "kernelgate code interpreter", Version: cfg.Version},
		&sdk.ServerOptions{Instructions: instructions})
	h.server = srv
	srv.AddReceivingMiddleware(h.badArgsCode)
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

// badArgs is the error of arguments a tool refuses.
type badArgs struct{ msg string }

func (e *badArgs) Error() string { return e.msg }

// toolFunc does a tool's work for a caller of access a, with its
// arguments (decoded and checked against the tool's schema by the SDK);
// the error it returns is the call's answer, named by toolError.
type toolFunc[In any] func(ctx context.Context, a Access, args In) (*sdk.CallToolResult, error)

// addTool adds a tool whose arguments decode into In: it finds the
// caller's access, runs f and answers its error.
func addTool[In any](h *Handler, srv *sdk.Server, t *sdk.Tool, f toolFunc[In]) {
	if s, ok := t.InputSchema.(*jsonschema.Schema); ok {
		h.schemas[t.Name] = s
	}
	sdk.AddTool(srv, t, func(ctx context.Context, req *sdk.CallToolRequest, args In) (*sdk.CallToolResult, any, error) {
		if ran, ok := ctx.Value(toolRanKey{}).(*bool); ok {
			*ran = true
		}
		a, err := h.access(req)
		var res *sdk.CallToolResult
		if err == nil {
			res, err = f(ctx, a, args)
		}
		if err != nil {
			return h.toolError(err), nil, nil
		}
		return res, nil, nil
	})
}

// inputSchema is the schema of a tool's arguments, inferred from In: its
// fields' json names (omitempty for an optional one) and their
// descriptions (jsonschema tags). edit adds what tags do not say (enums,
// patterns, bounds).
func inputSchema[In any](edit func(props map[string]*jsonschema.Schema)) *jsonschema.Schema {
	s, err := jsonschema.For[In](nil)
	if err != nil {
		panic(err)
	}
	if s.Properties == nil {
		s.Properties = map[string]*jsonschema.Schema{} // listed as {}, as clients expect
	}
	for _, p := range s.Properties {
		// Pointers and slices are inferred nullable; no argument takes null.
		if len(p.Types) == 2 && p.Types[0] == "null" {
			p.Type, p.Types = p.Types[1], nil
		}
	}
	if edit != nil {
		edit(s.Properties)
	}
	return s
}

// toolRanKey marks, in a tools/call's context, whether the tool's own
// handler ran.
type toolRanKey struct{}

// badArgsCode gives the SDK's answer to arguments that fail their schema
// (the tool's handler never ran) the code of bad input, as the tools'
// own answers to bad arguments have, and adds what the argument it names
// is.
func (h *Handler) badArgsCode(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		if method != "tools/call" {
			return next(ctx, method, req)
		}
		ran := new(bool)
		res, err := next(context.WithValue(ctx, toolRanKey{}, ran), method, req)
		r, ok := res.(*sdk.CallToolResult)
		if !ok || !r.IsError || *ran {
			return res, err
		}
		var props map[string]*jsonschema.Schema
		if call, ok := req.(*sdk.CallToolRequest); ok && h.schemas[call.Params.Name] != nil {
			props = h.schemas[call.Params.Name].Properties
		}
		for _, c := range r.Content {
			t, ok := c.(*sdk.TextContent)
			if !ok {
				continue
			}
			t.Text = "BAD_REQUEST: " + t.Text
			if m := namedProperty.FindStringSubmatch(t.Text); m != nil && props[m[1]] != nil && props[m[1]].Description != "" {
				t.Text += " (" + m[1] + ": " + props[m[1]].Description + ")"
			}
		}
		return res, err
	}
}

// namedProperty finds the argument a schema error names.
var namedProperty = regexp.MustCompile(`/properties/([A-Za-z0-9_]+)`)

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

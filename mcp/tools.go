package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"kernelgate/internal/seconds"
	"kernelgate/runs"
	"kernelgate/sessions"
)

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

func boolPtr(b bool) *bool { return &b }

// languageEnum limits a language argument to the languages the gateway
// serves (no limit when it serves none).
func (h *Handler) languageEnum(p *jsonschema.Schema) {
	for _, lang := range h.mgr.Catalog().Languages() {
		p.Enum = append(p.Enum, lang)
	}
}

func (h *Handler) addTools(srv *sdk.Server) {
	addTool(h, srv, &sdk.Tool{
		Name:  "run_code",
		Title: "Run code",
		Description: `Run code in a Jupyter kernel and return its output.

State persists: variables, imports, functions and files made by one call are there for the next call in the same context. Pass the id of a context made with create_context to keep your own state; without one, the code runs in the shared kernel of its language, which other callers use too.
Languages: python (default; ipykernel with numpy, pandas and matplotlib), javascript and typescript (Deno: top-level await, npm: and jsr: imports), r (R with IRkernel; the values of the code as results, plots as images), as this gateway serves them; kernelspec names any other installed kernel.
Returns stdout, stderr, the value of the last expression and anything displayed as text; matplotlib figures and other PNG or JPEG output as images; an exception as an error naming its type, with the traceback. The whole execution (every output, executionCount, process.reason) is in the structured content.
timeout is in seconds (0 or absent: none). When it runs out the kernel is interrupted and keeps its state. Runs in one context execute one at a time, in order. Output past the gateway's per-run limit is cut, with truncated: true.`,
		InputSchema: inputSchema[runArgs](func(p map[string]*jsonschema.Schema) {
			h.languageEnum(p["language"])
			p["timeout"].Minimum, p["timeout"].Maximum = new(0.0), new(sessions.MaxRunTimeout.Seconds())
		}),
		Annotations: &sdk.ToolAnnotations{Title: "Run code", DestructiveHint: boolPtr(true), OpenWorldHint: boolPtr(true)},
	}, h.runCode)

	addTool(h, srv, &sdk.Tool{
		Name:  "create_context",
		Title: "Create a context",
		Description: `Create an interpreter context: a kernel of its own whose state persists across run_code calls until delete_context. Its working directory is its own workspace, where the file tools read and write.
Returns the context, whose id you pass to run_code, interrupt, delete_context and the file tools. Keep the id: it stays valid for any client and across reconnections.`,
		InputSchema: inputSchema[createArgs](func(p map[string]*jsonschema.Schema) {
			h.languageEnum(p["language"])
			p["id"].Pattern = "^[A-Za-z0-9._-]{1,128}$"
		}),
		Annotations: &sdk.ToolAnnotations{Title: "Create a context", DestructiveHint: boolPtr(false), OpenWorldHint: boolPtr(false)},
	}, h.createContext)

	addTool(h, srv, &sdk.Tool{
		Name:        "list_contexts",
		Title:       "List contexts",
		Description: `List the interpreter contexts: id, language, whether its kernel is running (active; an inactive context starts a fresh kernel on its next run, without its earlier state), executionState, and when it was created and last used. The shared kernels appear as code-python, code-javascript, code-typescript and code-r once they have run code.`,
		InputSchema: inputSchema[struct{}](nil),
		Annotations: &sdk.ToolAnnotations{Title: "List contexts", ReadOnlyHint: true, OpenWorldHint: boolPtr(false)},
	}, h.listContexts)

	addTool(h, srv, &sdk.Tool{
		Name:        "delete_context",
		Title:       "Delete a context",
		Description: `Delete a context: its kernel is shut down and its state (variables, imports) is gone for good. A run in progress ends as lost.`,
		InputSchema: inputSchema[contextArgs](nil),
		Annotations: &sdk.ToolAnnotations{Title: "Delete a context", DestructiveHint: boolPtr(true), IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, h.deleteContext)

	addTool(h, srv, &sdk.Tool{
		Name:        "interrupt",
		Title:       "Interrupt a context",
		Description: `Interrupt the code a context is running (as Ctrl-C would: Python raises KeyboardInterrupt). The kernel and its state stay. Use it to stop a run that takes too long.`,
		InputSchema: inputSchema[contextArgs](nil),
		Annotations: &sdk.ToolAnnotations{Title: "Interrupt a context", DestructiveHint: boolPtr(false), IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, h.interrupt)

	h.addCommandTools(srv)
	if h.cfg.Files != nil {
		h.addFileTools(srv)
	}
}

// runArgs are run_code's arguments.
type runArgs struct {
	Code       string  `json:"code" jsonschema:"The code to run."`
	Language   string  `json:"language,omitempty" jsonschema:"The language; python when omitted. With context, it must be the context's language."`
	Kernelspec string  `json:"kernelspec,omitempty" jsonschema:"The name of an installed kernelspec to run on, instead of language (GET /api/kernelspecs lists them)."`
	Context    string  `json:"context,omitempty" jsonschema:"The id of a context from create_context or list_contexts. Omitted: the shared kernel of the language."`
	Timeout    float64 `json:"timeout,omitempty" jsonschema:"Seconds before the run is interrupted; 0 or absent: no limit; at most 31536000 (365 days)."`
}

func (h *Handler) runCode(ctx context.Context, a Access, args runArgs) (*sdk.CallToolResult, error) {
	if a.Context != "" && args.Context == "" {
		args.Context = a.Context // a context token runs in its context
	}
	if err := h.check(a, true, args.Context); err != nil {
		return nil, err
	}
	timeout, ok := seconds.Of(args.Timeout, sessions.MaxRunTimeout)
	if !ok {
		return nil, &badArgs{sessions.TimeoutRange}
	}
	run, err := h.mgr.Execute(ctx, sessions.ExecuteRequest{
		Code: args.Code, Language: args.Language, Kernelspec: args.Kernelspec, Context: args.Context, Timeout: timeout,
	})
	if err != nil {
		return nil, err
	}
	select {
	case <-run.Done():
	case <-ctx.Done():
		// The client cancelled the call: stop the run, keep the kernel.
		run.Interrupt()
		<-run.Done()
	}
	if f := run.Failure(); f != nil {
		return nil, f
	}
	return executionResult(run.ExecutionJSON())
}

// logsContent is an Execution's stdout, then its stderr, as text.
func logsContent(e *runs.Execution) []sdk.Content {
	var content []sdk.Content
	if out := strings.Join(e.Logs.Stdout, ""); out != "" {
		content = append(content, &sdk.TextContent{Text: out})
	}
	if out := strings.Join(e.Logs.Stderr, ""); out != "" {
		content = append(content, &sdk.TextContent{Text: "stderr:\n" + out})
	}
	return content
}

// executionResult turns an Execution into a tool result: text for the
// logs, the results' text and the error; images for PNG and JPEG; the
// Execution itself as structured content.
func executionResult(js []byte) (*sdk.CallToolResult, error) {
	var e runs.Execution
	if err := json.Unmarshal(js, &e); err != nil {
		return nil, err
	}
	content := logsContent(&e)
	text := func(s string) { content = append(content, &sdk.TextContent{Text: s}) }
	for _, r := range e.Results {
		image := false
		for _, img := range []struct{ b64, mime string }{{r.PNG, "image/png"}, {r.JPEG, "image/jpeg"}} {
			if img.b64 == "" {
				continue
			}
			data, err := base64.StdEncoding.DecodeString(strings.TrimSpace(img.b64))
			if err != nil {
				continue
			}
			content = append(content, &sdk.ImageContent{Data: data, MIMEType: img.mime})
			image = true
		}
		if t := runs.StripANSI(r.Text); t != "" && !(image && strings.HasPrefix(t, "<Figure")) {
			text(t)
		}
	}
	failed := false
	if e.Error != nil {
		failed = true
		msg := e.Error.Name + ": " + e.Error.Value
		if tb := strings.Join(e.Error.Traceback, "\n"); tb != "" {
			msg += "\n" + tb
		}
		text(msg)
	}
	switch e.Process.Reason {
	case runs.TimedOut:
		failed = true
		text("The run timed out: the kernel was interrupted and keeps its state.")
	case runs.Lost:
		failed = true
		why := "The kernel stopped during the run (it died, was restarted or deleted): its state is gone, and the next run starts a fresh kernel."
		if e.Process.Message != "" {
			why += " " + e.Process.Message
		}
		text(why)
	case runs.Interrupted:
		if e.Error == nil {
			text("The run was interrupted.")
		}
	}
	if e.Truncated {
		text("Output past the per-run limit was cut (truncated: true).")
	}
	if len(content) == 0 {
		text("(no output)")
	}
	return &sdk.CallToolResult{Content: content, StructuredContent: json.RawMessage(js), IsError: failed}, nil
}

// contextArgs are the arguments of the tools that name a context.
type contextArgs struct {
	Context string `json:"context" jsonschema:"The context's id."`
}

type createArgs struct {
	Language   string   `json:"language,omitempty" jsonschema:"The language; python when omitted."`
	Kernelspec string   `json:"kernelspec,omitempty" jsonschema:"The name of an installed kernelspec for the context's kernel, instead of language."`
	ID         string   `json:"id,omitempty" jsonschema:"An id of your choice; one is generated when omitted. An id in use is refused."`
	Packages   []string `json:"packages,omitempty" jsonschema:"Packages installed into this context only, before it is returned: pip requirements (\"requests==2.31\") for Python; npm:, jsr: or https: specifiers for Deno. A failed install fails the call with pip's message."`
}

func (h *Handler) createContext(ctx context.Context, a Access, args createArgs) (*sdk.CallToolResult, error) {
	if a.Context != "" {
		return nil, fmt.Errorf("%w: a context token may only use its context", ErrForbidden)
	}
	if err := h.check(a, true, ""); err != nil {
		return nil, err
	}
	c, err := h.mgr.CreateContext(ctx, sessions.ContextRequest{ID: args.ID, Language: args.Language, Kernelspec: args.Kernelspec, Packages: args.Packages})
	if err != nil {
		return nil, err
	}
	m := c.Model()
	return jsonResult(fmt.Sprintf("Created context %s (%s). Pass context: %q to run_code.", m.ID, m.Language, m.ID), m)
}

func (h *Handler) listContexts(ctx context.Context, a Access, _ struct{}) (*sdk.CallToolResult, error) {
	if err := h.check(Access{Read: a.Read, Exec: a.Exec}, false, ""); err != nil {
		return nil, err
	}
	out := []json.RawMessage{}
	for _, c := range h.mgr.Contexts() {
		if a.Context != "" && h.check(a, false, c.ID) != nil {
			continue // a context token sees its own context only
		}
		js, err := json.Marshal(c.Model())
		if err != nil {
			return nil, err
		}
		out = append(out, js)
	}
	if h.cfg.Contexts != nil {
		out = h.cfg.Contexts(ctx, a, out)
	}
	var b strings.Builder
	if len(out) == 0 {
		b.WriteString("No contexts yet: create one with create_context.")
	}
	for _, js := range out {
		var m struct {
			ID, Language, ExecutionState, LastActivity string
			Active                                     bool
		}
		json.Unmarshal(js, &m)
		state := "kernel running"
		if !m.Active {
			state = "no kernel (the next run starts a fresh one)"
		}
		fmt.Fprintf(&b, "%s: %s, %s, %s, last used %s\n", m.ID, m.Language, state, m.ExecutionState, m.LastActivity)
	}
	return jsonResult(strings.TrimRight(b.String(), "\n"), map[string]any{"contexts": out})
}

func (h *Handler) deleteContext(ctx context.Context, a Access, args contextArgs) (*sdk.CallToolResult, error) {
	if a.Context != "" {
		return nil, fmt.Errorf("%w: a context token cannot delete its context", ErrForbidden)
	}
	if err := h.check(a, true, args.Context); err != nil {
		return nil, err
	}
	if err := h.mgr.DeleteContext(ctx, args.Context); err != nil {
		return nil, err
	}
	if h.cfg.ContextDeleted != nil {
		h.cfg.ContextDeleted(args.Context)
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "Deleted context " + args.Context + "."}}}, nil
}

func (h *Handler) interrupt(ctx context.Context, a Access, args contextArgs) (*sdk.CallToolResult, error) {
	if err := h.check(a, true, args.Context); err != nil {
		return nil, err
	}
	c, err := h.mgr.Context(args.Context)
	if err == nil {
		err = c.Interrupt(ctx)
	}
	if err != nil {
		return nil, err
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "Interrupted context " + args.Context + "; its state is kept."}}}, nil
}

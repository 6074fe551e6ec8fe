package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"kernelgate/internal/seconds"
	"kernelgate/runs"
	"kernelgate/sessions"
)

// addCommandTools adds run_command.
func (h *Handler) addCommandTools(srv *sdk.Server) {
	addTool(h, srv, &sdk.Tool{
		Name:  "run_command",
		Title: "Run a shell command",
		Description: `Run a shell command (/bin/sh -c) beside a context's kernel and return its output and exit code: install a package (pip install polars), list or move files, run a script.
It runs in the context's workspace (the folder run_code's code works in and the file tools read and write), with the kernel's environment: a file it writes is read by code, and a package pip installs is imported by the context's Python code. Without context, it runs beside the shared Python kernel (code-python).
It does not wait behind code the context is running. timeout is in seconds (0 or absent: none); when it runs out the command and what it started are killed. Its input is empty: a command that asks a question gets no answer (pass -y and the like). Output past the gateway's per-run limit is cut, with truncated: true. The whole execution (logs, process.exitCode, process.reason) is in the structured content.`,
		InputSchema: inputSchema[commandArgs](func(p map[string]*jsonschema.Schema) {
			p["timeout"].Minimum = new(0.0)
		}),
		Annotations: &sdk.ToolAnnotations{Title: "Run a shell command", DestructiveHint: boolPtr(true), OpenWorldHint: boolPtr(true)},
	}, h.runCommand)
}

// commandArgs are run_command's arguments.
type commandArgs struct {
	Command string  `json:"command" jsonschema:"The command line, run with /bin/sh -c."`
	Context string  `json:"context,omitempty" jsonschema:"The id of a context from create_context or list_contexts. Omitted: the shared Python kernel's context, code-python."`
	Timeout float64 `json:"timeout,omitempty" jsonschema:"Seconds before the command is killed; 0 or absent: no limit."`
}

func (h *Handler) runCommand(ctx context.Context, a Access, args commandArgs) (*sdk.CallToolResult, error) {
	if strings.TrimSpace(args.Command) == "" {
		return nil, &badArgs{"command is required"}
	}
	if args.Context == "" {
		args.Context = a.Context // a context token runs in its context
	}
	if args.Context == "" {
		args.Context = "code-python"
	}
	if err := h.check(a, true, args.Context); err != nil {
		return nil, err
	}
	timeout, ok := seconds.Of(args.Timeout, sessions.MaxRunTimeout)
	if !ok {
		return nil, &badArgs{sessions.TimeoutRange}
	}
	run, err := h.mgr.RunCommand(ctx, sessions.CommandRequest{
		Context: args.Context, Argv: sessions.ShellCommand(args.Command), Timeout: timeout,
	})
	if err != nil {
		return nil, err
	}
	select {
	case <-run.Done():
	case <-ctx.Done():
		// The client cancelled the call: the command goes too.
		run.Kill()
		<-run.Done()
	}
	return commandResult(run.ExecutionJSON())
}

// commandResult turns a command's Execution into a tool result: its
// stdout, its stderr and how it ended as text, the Execution as
// structured content; an error unless it exited 0.
func commandResult(js []byte) (*sdk.CallToolResult, error) {
	var e runs.Execution
	if err := json.Unmarshal(js, &e); err != nil {
		return nil, err
	}
	content := logsContent(&e)
	text := func(s string) { content = append(content, &sdk.TextContent{Text: s}) }
	code := -1
	if e.Process.ExitCode != nil {
		code = *e.Process.ExitCode
	}
	switch e.Process.Reason {
	case runs.TimedOut:
		text("The command timed out and was killed.")
	case runs.Killed:
		text("The command was killed.")
	case runs.Interrupted:
		text(fmt.Sprintf("The command was interrupted (exit code %d).", code))
	case runs.Lost:
		text("The command was stopped: " + e.Process.Message)
	default:
		text(fmt.Sprintf("Exit code %d.", code))
	}
	if e.Truncated {
		text("Output past the per-run limit was cut (truncated: true).")
	}
	return &sdk.CallToolResult{Content: content, StructuredContent: json.RawMessage(js), IsError: code != 0}, nil
}

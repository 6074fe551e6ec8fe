package mcp

import (
	"context"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Arguments a tool cannot take are refused with BAD_REQUEST, saying what
// is wrong, before anything runs: unknown or missing ones, ones of the
// wrong type, and values out of range.
func TestToolArgumentsRefused(t *testing.T) {
	cs := inMemoryClient(t)
	for _, c := range []struct {
		tool string
		args map[string]any
		want string // in the message
	}{
		{"run_code", map[string]any{"code": "1", "bogus": true}, "bogus"},
		{"run_code", map[string]any{}, "code"},
		{"run_code", map[string]any{"code": 1}, "code"},
		{"run_code", map[string]any{"code": "1", "timeout": -1}, "Seconds before the run is interrupted"},
		{"run_code", map[string]any{"code": "1", "timeout": 1e10}, "at most 31536000"},
		{"run_code", map[string]any{"code": "1", "language": "cobol"}, "language"},
		{"create_context", map[string]any{"id": "a/b"}, "id"},
		{"create_context", map[string]any{"packages": "numpy"}, "packages"},
		{"list_contexts", map[string]any{"all": true}, "all"},
		{"delete_context", map[string]any{}, "context"},
		{"interrupt", map[string]any{"context": nil}, "context"},
		{"run_command", map[string]any{"command": " "}, "command is required"},
		{"run_command", map[string]any{"command": "true", "shell": true}, "shell"},
		{"run_command", map[string]any{"command": "true", "timeout": 1e10}, "second"},
		{"write_file", map[string]any{"context": "c", "path": "a"}, "content or contentBase64 is required"},
		{"write_file", map[string]any{"context": "c", "path": "a", "content": "x", "contentBase64": "eA=="}, "not both"},
		{"write_file", map[string]any{"context": "c", "path": "a", "contentBase64": "%%"}, "not base64"},
		{"read_file", map[string]any{"context": "c"}, "path"},
		{"list_files", map[string]any{"path": "."}, "context"},
	} {
		res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: c.tool, Arguments: c.args})
		if err != nil {
			t.Errorf("%s %v: %v", c.tool, c.args, err)
			continue
		}
		text := ""
		for _, x := range res.Content {
			if tc, ok := x.(*sdk.TextContent); ok {
				text += tc.Text
			}
		}
		if !res.IsError || !strings.HasPrefix(text, "BAD_REQUEST: ") || !strings.Contains(text, c.want) {
			t.Errorf("%s %v = error %v, %q; want BAD_REQUEST naming %q", c.tool, c.args, res.IsError, text, c.want)
		}
	}
}

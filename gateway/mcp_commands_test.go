//go:build linux

package gateway

import (
	"strings"
	"testing"
	"time"
)

// TestMCPRunCommand: run_command through the official Go SDK: output and
// exit code, a file it writes read by run_code in the same context, the
// shared kernel's context by default, a timeout, and a context token kept
// to its context.
func TestMCPRunCommand(t *testing.T) {
	g := newGateway(t)
	cs, err := mcpClient(t, g, "Bearer "+g.token)
	if err != nil {
		t.Fatal(err)
	}
	if res := call(t, cs, "create_context", map[string]any{"id": "mcp-cmd"}); res.IsError {
		t.Fatalf("create_context: %s", texts(res))
	}
	res := call(t, cs, "run_command", map[string]any{"command": "echo made > made.txt; echo out; echo warn >&2", "context": "mcp-cmd"})
	if got := texts(res); res.IsError || !strings.Contains(got, "out\n") || !strings.Contains(got, "stderr:\nwarn\n") || !strings.Contains(got, "Exit code 0.") {
		t.Errorf("run_command: error %v, %q", res.IsError, got)
	}
	exec := structured[map[string]any](t, res)
	if p, _ := exec["process"].(map[string]any); exec["context"] != "mcp-cmd" || p["exitCode"] != 0.0 || p["reason"] != "completed" {
		t.Errorf("structured Execution = %v", exec)
	}
	if res := call(t, cs, "run_code", map[string]any{"code": "open('made.txt').read().strip()", "context": "mcp-cmd"}); !strings.Contains(texts(res), "'made'") {
		t.Errorf("run_code read the command's file: %s", texts(res))
	}
	if res := call(t, cs, "run_command", map[string]any{"command": "exit 4", "context": "mcp-cmd"}); !res.IsError || !strings.Contains(texts(res), "Exit code 4.") {
		t.Errorf("failing command: error %v, %q", res.IsError, texts(res))
	}
	if res := call(t, cs, "run_command", map[string]any{"command": "echo $PWD"}); res.IsError || !strings.Contains(texts(res), "code-python") {
		t.Errorf("run_command without context: %q", texts(res))
	}
	start := time.Now()
	if res := call(t, cs, "run_command", map[string]any{"command": "sleep 60", "context": "mcp-cmd", "timeout": 0.5}); !res.IsError || !strings.Contains(texts(res), "timed out") {
		t.Errorf("timed out command: %q", texts(res))
	}
	if time.Since(start) > 30*time.Second {
		t.Errorf("a 0.5 s timeout took %v", time.Since(start))
	}
	for _, args := range []map[string]any{{}, {"command": ""}, {"command": "true", "shell": true}} {
		if res := call(t, cs, "run_command", args); !res.IsError || !strings.HasPrefix(texts(res), "BAD_REQUEST:") {
			t.Errorf("run_command %v: %q", args, texts(res))
		}
	}

	b4Context(t, g, map[string]any{"id": "other"})
	status, out := g.do("POST", "/api/contexts/mcp-cmd/tokens", map[string]any{"ttl": 600})
	if status != 200 && status != 201 {
		t.Fatalf("mint: %d %s", status, out)
	}
	tcs, err := mcpClient(t, g, "Bearer "+decode[map[string]any](t, out)["token"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if res := call(t, tcs, "run_command", map[string]any{"command": "cat made.txt"}); res.IsError || !strings.Contains(texts(res), "made") {
		t.Errorf("context token in its context: %q", texts(res))
	}
	if res := call(t, tcs, "run_command", map[string]any{"command": "true", "context": "other"}); !res.IsError || !strings.HasPrefix(texts(res), "FORBIDDEN:") {
		t.Errorf("context token in another context: %q", texts(res))
	}
}

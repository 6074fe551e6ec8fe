//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"syscall"
	"testing"

	"kernelgate/internal/pgtest"
)

// mcpTool calls an MCP tool through the gateway at url and returns its
// result's structured content.
func mcpTool(t *testing.T, url, name string, args map[string]any, out any) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": name, "arguments": args}})
	req, _ := http.NewRequest("POST", url+"mcp", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The answer is JSON, or an event stream of one message.
	js := answer
	for _, line := range bytes.Split(answer, []byte("\n")) {
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			js = d
		}
	}
	var rpc struct {
		Result struct {
			IsError           bool            `json:"isError"`
			StructuredContent json.RawMessage `json:"structuredContent"`
		} `json:"result"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(js, &rpc) != nil || rpc.Result.IsError {
		t.Fatalf("MCP %s through %s: %d %s", name, url, resp.StatusCode, answer)
	}
	if err := json.Unmarshal(rpc.Result.StructuredContent, out); err != nil {
		t.Fatalf("MCP %s through %s: %v: %s", name, url, err, answer)
	}
}

// TestReplicaMCPListContextsIsTheClusters: contexts made through two
// replicas are listed by MCP's list_contexts through each, once each,
// with their owners, as GET /api/contexts lists them.
func TestReplicaMCPListContextsIsTheClusters(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	gs := startReplicas(t, bin, srv, "mcp-list", 2)
	owner := map[string]string{}
	for i, g := range gs {
		id := []string{"mcp-a", "mcp-b"}[i]
		call(t, "POST", g.url+"api/contexts", map[string]any{"id": id, "language": "python"}, 201, nil)
		call(t, "POST", g.url+"api/execute", map[string]any{"context": id, "code": "1"}, 200, nil)
		owner[id] = replicaURL(g)
	}
	for _, g := range gs {
		var got struct {
			Contexts []listed `json:"contexts"`
		}
		mcpTool(t, g.url, "list_contexts", map[string]any{}, &got)
		seen := map[string]int{}
		for _, c := range got.Contexts {
			seen[c.ID]++
			if want, ok := owner[c.ID]; ok && c.Replica != want {
				t.Errorf("list_contexts through %s: %s is %q's, want %s's", g.url, c.ID, c.Replica, want)
			}
		}
		for id := range owner {
			if seen[id] != 1 {
				t.Errorf("list_contexts through %s lists %s %d times, want once: %+v", g.url, id, seen[id], got.Contexts)
			}
		}
	}
	// One after the other: the last one standing shuts the kernels down.
	for _, g := range gs {
		if err := g.kill(t, syscall.SIGTERM); err != nil {
			t.Errorf("%s: exit after SIGTERM: %v", g.url, err)
		}
	}
}

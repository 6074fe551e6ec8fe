//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
)

// TestReplicasShareWorkspaceRootAndKernelLimit: replicas serve one
// --workspace-root together (a gateway of its own would be refused on
// it), a file uploaded through one replica is read by the kernel and
// downloaded through the other, and --max-kernels counts the kernels of
// every replica.
func TestReplicasShareWorkspaceRootAndKernelLimit(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	root := filepath.Join(t.TempDir(), "workspaces")
	gs := startReplicas(t, bin, srv, "shared", 2, "--workspace-root", root, "--max-kernels", "1")
	a, b := gs[0], gs[1]

	call(t, "POST", a.url+"api/contexts", map[string]any{"id": "one", "language": "python"}, 201, nil)
	var e execution
	call(t, "POST", a.url+"api/execute", map[string]any{"context": "one", "code": "1"}, 200, &e)
	call(t, "PUT", b.url+"api/contexts/one/files/data.txt", "from b", 201, nil)
	call(t, "POST", b.url+"api/execute", map[string]any{"context": "one", "code": "open('data.txt').read()"}, 200, &e)
	if e.text() != `'"from b"'` {
		t.Errorf("the kernel read the file uploaded through B as %s", e.text())
	}

	// A's kernel takes the cluster's one place: a kernel B would start is refused.
	var refused struct {
		Code string `json:"code"`
	}
	call(t, "POST", b.url+"api/execute", map[string]any{"isolated": true, "code": "1"}, 429, &refused)
	if refused.Code != "RESOURCE_EXHAUSTED" {
		t.Errorf("a second kernel across the replicas: code %q, want RESOURCE_EXHAUSTED", refused.Code)
	}
	call(t, "DELETE", b.url+"api/contexts/one", nil, 204, nil)
	// Its lease released, the place is free for B.
	waitFor(t, func() bool {
		return postStatus(b.url+"api/execute", map[string]any{"isolated": true, "code": "2"}) == 200
	},
		"an isolated run through B once A's kernel was deleted", func() []any { return nil })
}

// postStatus POSTs body as JSON and returns the status (0 when the
// request failed).
func postStatus(url string, body any) int {
	js, _ := json.Marshal(body)
	client := &http.Client{Timeout: 60 * time.Second}
	resp, err := client.Post(url, "application/json", bytes.NewReader(js))
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

//go:build linux

package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
)

// TestReplicasFreeKernelTakenOverOnRequest: once the lease of a dead
// replica's kernel has lapsed, a request for its context to a survivor
// is answered by taking the kernel over there and then, never with
// 404 while the failover scan has not come yet. Before the lapse the
// dead owner cannot be reached (503 UNAVAILABLE); the context keeps its
// state.
func TestReplicasFreeKernelTakenOverOnRequest(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	gs := startReplicas(t, bin, srv, "ondemand", 3, "--lease", "3s")
	call(t, "POST", gs[0].url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, nil)
	var e execution
	call(t, "POST", gs[1].url+"api/execute", map[string]any{"context": "agent", "code": "x = 41"}, 200, &e)
	owner, survivors := ownerOf(t, gs, "agent")
	owner.kill(t, syscall.SIGKILL)

	client := &http.Client{Timeout: 10 * time.Second}
	seen := map[int]int{}
	var last []byte
	if !pollUntil(30*time.Second, func() bool {
		resp, err := client.Get(survivors[0].url + "api/contexts/agent")
		if err != nil {
			t.Fatalf("GET the context through a survivor: %v", err)
		}
		defer resp.Body.Close()
		last, _ = io.ReadAll(resp.Body)
		seen[resp.StatusCode]++
		if resp.StatusCode == http.StatusServiceUnavailable {
			var ae struct{ Code string }
			if json.Unmarshal(last, &ae); ae.Code != "UNAVAILABLE" {
				t.Fatalf("GET the context while its owner is dead: 503 %s, want UNAVAILABLE (the owner cannot be reached)", last)
			}
		}
		return resp.StatusCode == 200
	}) {
		t.Fatalf("the context did not answer through a survivor within 30 s: answers %v, last %s", seen, last)
	}
	t.Logf("answers through the survivor: %v; taken over on request: %v", seen, strings.Contains(survivors[0].logs.String(), "took a kernel over on request"))
	if n := seen[http.StatusNotFound]; n > 0 {
		t.Errorf("the context answered 404 %d times through a survivor after its owner died (answers %v): a kernel whose lease lapsed is taken over on request", n, seen)
	}
	call(t, "POST", survivors[0].url+"api/execute", map[string]any{"context": "agent", "code": "x + 1"}, 200, &e)
	if e.text() != "42" {
		t.Errorf("x + 1 after the takeover: %+v, want 42 (its state kept)", e)
	}
}

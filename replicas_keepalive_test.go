//go:build linux

package main

import (
	"io"
	"net/http"
	"syscall"
	"testing"

	"kernelgate/internal/pgtest"
)

// TestReplicaLeavingClosesKeepAlive: a replica stopped while a run is in
// progress on it is leaving (GET /readyz 503) while the run drains; its
// answers then say Connection: close, so that a client holding a
// keep-alive connection to it opens its next one elsewhere (before the
// server closes idle connections at its Shutdown). Before it was
// stopped, they did not.
func TestReplicaLeavingClosesKeepAlive(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	gs := startReplicas(t, bin, srv, "keepalive", 2)
	a := gs[0]
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	get := func(path string) *http.Response {
		t.Helper()
		resp, err := client.Get(a.url + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if resp := get("api/status"); resp.Close {
		t.Fatalf("GET /api/status before the stop: Connection: close, want the connection kept")
	}
	call(t, "POST", a.url+"api/contexts", map[string]any{"id": "slow", "language": "python"}, 201, nil)
	slow := make(chan slowAnswer, 1)
	go func() {
		var r slowAnswer
		r.code, r.body, r.err = postJSONRaw(a.url+"api/execute", map[string]any{"context": "slow", "code": "import time; time.sleep(3); 7"})
		slow <- r
	}()
	waitFor(t, func() bool {
		var cm struct{ ExecutionState string }
		_, err := tryCall(a.url+"api/contexts/slow", &cm)
		return err == nil && cm.ExecutionState == "busy"
	}, "the slow run did not start", func() []any { return nil })
	stopped := make(chan error, 1)
	go func() { stopped <- a.kill(t, syscall.SIGTERM) }()
	waitFor(t, func() bool {
		resp, err := http.Get(a.url + "readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	}, "the replica stopped does not say it is not ready", func() []any { return nil })
	if resp := get("api/status"); !resp.Close {
		t.Errorf("GET /api/status while the replica is leaving: %d, connection kept, want Connection: close", resp.StatusCode)
	}
	if r := <-slow; r.err != nil || r.code != 200 {
		t.Errorf("the run in progress: %d %s %v", r.code, r.body, r.err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	if err := gs[1].kill(t, syscall.SIGTERM); err != nil {
		t.Errorf("the last replica: exit after SIGTERM: %v", err)
	}
}

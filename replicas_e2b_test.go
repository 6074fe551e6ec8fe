//go:build linux

package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"kernelgate/internal/pgtest"
)

// TestReplicasE2BSandboxFollowsItsKernel: an E2B sandbox lives with its
// default context's kernel. When the replica that created it is
// SIGKILLed, the survivor that takes the kernel over takes the sandbox
// over too: the sandbox answers through it with its state (x kept), a
// timeout set through it is its own, and when that timeout runs out the
// survivor kills the sandbox, its context and kernel with it.
func TestReplicasE2BSandboxFollowsItsKernel(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	gs := startReplicas(t, bin, srv, "sandboxes", 2, "--lease", "2s")
	a, b := gs[0], gs[1]
	status, out := e2bDo(t, "POST", a.url+"e2b/v2/sandboxes", map[string]any{"timeout": 600}, e2bKey)
	var sb e2bSandbox
	if status != http.StatusCreated || json.Unmarshal(out, &sb) != nil || sb.EnvdAccessToken == "" {
		t.Fatalf("create sandbox through A: %d %s", status, out)
	}
	if _, errName := e2bRun(t, b.url, sb, "x = 41"); errName != "" {
		t.Fatalf("x = 41 in the sandbox through B: %s", errName)
	}
	a.kill(t, syscall.SIGKILL)

	// Within the lease and a few seconds the survivor serves the sandbox.
	in := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": sb.EnvdAccessToken}
	var last string
	waitFor(t, func() bool {
		status, out := e2bDo(t, "POST", b.url+"e2b/execute", map[string]any{"code": "x + 1"}, in)
		last = string(out)
		return status == http.StatusOK && strings.Contains(last, `"text":"42"`)
	}, "the sandbox through the survivor after its creator's death: %s\n%s", func() []any { return []any{last, b.logs} })

	if status, out := e2bDo(t, "POST", b.url+"e2b/v2/sandboxes/"+sb.SandboxID+"/timeout", map[string]any{"timeout": 2}, e2bKey); status != http.StatusNoContent {
		t.Fatalf("setting the sandbox's timeout through the survivor: %d %s", status, out)
	}
	waitFor(t, func() bool { return sandboxStatus(t, b.url, sb.SandboxID) == http.StatusNotFound },
		"sandbox %s still there after its timeout ran out on the survivor\n%s", func() []any { return []any{sb.SandboxID, b.logs} })
	// Its context goes with it (deleted right after the sandbox).
	var cs []ctxModel
	waitFor(t, func() bool {
		call(t, "GET", b.url+"api/contexts", nil, 200, &cs)
		for _, c := range cs {
			if strings.HasPrefix(c.ID, "e2b-"+sb.SandboxID+"-") {
				return false
			}
		}
		return true
	}, "the sandbox's context outlived it: %+v", func() []any { return []any{cs} })
	if !strings.Contains(b.logs.String(), "e2b sandbox taken over") {
		t.Errorf("the survivor's log does not say it took the sandbox over")
	}
}

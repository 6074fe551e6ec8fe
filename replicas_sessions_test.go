//go:build linux

package main

import (
	"syscall"
	"testing"

	"kernelgate/internal/pgtest"
)

// TestReplicaSessionOfAPathIsTheClusters: a Jupyter session made
// through A for a path; POST /api/sessions for that path through B
// (naming a kernelspec, no kernel) answers with A's session and kernel,
// as one gateway answers for a path it has a session of, and the
// cluster lists one session of the path.
func TestReplicaSessionOfAPathIsTheClusters(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	gs := startReplicas(t, bin, srv, "session-path", 2)
	a, b := gs[0], gs[1]
	type session struct {
		ID     string `json:"id"`
		Path   string `json:"path"`
		Kernel struct {
			ID      string `json:"id"`
			Replica string `json:"replica"`
		} `json:"kernel"`
	}
	body := map[string]any{"path": "shared/analysis.ipynb", "type": "notebook", "kernel": map[string]any{"name": "python3"}}
	var first session
	call(t, "POST", a.url+"api/sessions", body, 201, &first)
	if first.Kernel.Replica != replicaURL(a) {
		t.Fatalf("the session made through A: kernel %+v, want A's", first.Kernel)
	}
	for _, g := range []*gatewayProcess{b, a} {
		var again session
		call(t, "POST", g.url+"api/sessions", body, 201, &again)
		if again.ID != first.ID || again.Kernel.ID != first.Kernel.ID {
			t.Errorf("POST /api/sessions for %s through %s: session %s kernel %s, want A's session %s kernel %s",
				body["path"], g.url, again.ID, again.Kernel.ID, first.ID, first.Kernel.ID)
		}
	}
	for _, g := range gs {
		var all []session
		call(t, "GET", g.url+"api/sessions", nil, 200, &all)
		n := 0
		for _, s := range all {
			if s.Path == body["path"] {
				n++
			}
		}
		if n != 1 {
			t.Errorf("GET /api/sessions through %s lists %d sessions of %s, want 1: %+v", g.url, n, body["path"], all)
		}
	}
	// One after the other: the last one standing shuts the kernels down.
	for _, g := range gs {
		if err := g.kill(t, syscall.SIGTERM); err != nil {
			t.Errorf("%s: exit after SIGTERM: %v", g.url, err)
		}
	}
}

//go:build linux

package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"kernelgate/internal/leakcheck"
	"kernelgate/internal/testkernels"
	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
	"kernelgate/sessions"
)

// TestCommandCyclesLeakNothing starts and stops gateways that run
// commands (one ended, one killed, one with stdin, one left running when
// the gateway stops) and checks that goroutines, open files and processes
// come back to where they were.
func TestCommandCyclesLeakNothing(t *testing.T) {
	specs := kernelspecs.Load([]string{testkernels.Dir(t)})
	cycle := func() {
		mgr := sessions.New(sessions.Config{}, specs, &jupyter.LocalProvisioner{RuntimeDir: t.TempDir()}, nil)
		srv := New(Config{Token: testToken}, mgr, nil)
		hs := httptest.NewServer(srv)
		g := &testGateway{t: t, url: hs.URL, token: testToken, mgr: mgr, srv: srv}
		b4Context(t, g, map[string]any{"id": "c1"})
		g.command("c1", map[string]any{"cmd": "echo out; echo err >&2"})
		killed := g.background("c1", map[string]any{"cmd": "sleep 300 & wait"})
		g.do("POST", "/api/runs/"+killed+"/kill", nil)
		g.waitRun(killed, 30*time.Second)
		in := g.background("c1", map[string]any{"cmd": "read x; echo $x", "stdin": true})
		g.do("POST", "/api/runs/"+in+"/input", map[string]string{"value": "v\n"})
		g.waitRun(in, 30*time.Second)
		g.background("c1", map[string]any{"cmd": "sleep 300"})

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		hs.Close()
		mgr.Close(ctx)
	}
	cycle() // warm up what the runtime starts once
	before := leakcheck.Snapshot(t)
	for i := 0; i < 2; i++ {
		cycle()
	}
	http.DefaultClient.CloseIdleConnections() // the test's own client side
	leakcheck.Check(t, before)
}

package gateway

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"kernelgate/internal/leakcheck"
	"kernelgate/internal/testkernels"
	"kernelgate/kernelspecs"
	"kernelgate/provision/local"
	"kernelgate/sessions"
)

// TestGatewayCyclesLeakNothing starts and stops whole gateways, each
// running kernels, websockets, runs, streams and isolated runs, and checks
// that goroutines, open files and processes come back to where they were.
func TestGatewayCyclesLeakNothing(t *testing.T) {
	checkCyclesLeakNothing(t, sessions.Config{PoolSize: 1}, 3, func(g *testGateway) func() {
		k := g.startKernel("python3")
		c := g.mustDial(k.ID, true)
		c.run("1+1")
		g.run(map[string]any{"code": "print('shared')"})
		g.run(map[string]any{"code": "1", "isolated": true})
		g.do("POST", "/api/contexts", map[string]any{"id": "c1"})
		resp := startStream(t, g, map[string]any{"code": "print(1)", "context": "c1"})
		readEvents(t, bufio.NewScanner(resp.Body), func(e event) bool { return e.Type == "end" })
		resp.Body.Close()
		g.do("DELETE", "/api/contexts/c1", nil)
		g.do("DELETE", "/api/kernels/"+k.ID, nil)
		// One websocket left open: shutdown must close it.
		k2 := g.startKernel("python3")
		c2 := g.mustDial(k2.ID, false)
		return func() { // the test's own client ends of the websockets
			c.conn.Close()
			c2.conn.Close()
		}
	})
}

// checkCyclesLeakNothing runs use on a whole gateway of cfg, then stops
// the gateway and calls what use returned; after a first cycle (what the
// runtime starts once), it checks that cycles more of it leave
// goroutines, open files and processes where they were.
func checkCyclesLeakNothing(t *testing.T, cfg sessions.Config, cycles int, use func(g *testGateway) (after func())) {
	t.Helper()
	specs := kernelspecs.Load([]string{testkernels.Dir(t)})
	cycle := func() {
		mgr := sessions.New(cfg, specs, &local.Provisioner{RuntimeDir: t.TempDir()}, nil)
		srv := New(Config{Token: testToken}, mgr, nil)
		hs := httptest.NewServer(srv)
		after := use(&testGateway{t: t, url: hs.URL, token: testToken, mgr: mgr, srv: srv})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		hs.Close()
		mgr.Close(ctx)
		if after != nil {
			after()
		}
	}
	cycle()
	before := leakcheck.Snapshot(t)
	for range cycles {
		cycle()
	}
	http.DefaultClient.CloseIdleConnections() // the test's own client side
	leakcheck.Check(t, before)
	if t.Failed() {
		entries, _ := os.ReadDir("/proc/self/fd")
		for _, e := range entries {
			target, _ := os.Readlink("/proc/self/fd/" + e.Name())
			t.Log(e.Name(), target)
		}
	}
}

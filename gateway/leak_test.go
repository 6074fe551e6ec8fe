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
	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
	"kernelgate/sessions"
)

// TestGatewayCyclesLeakNothing starts and stops whole gateways, each
// running kernels, websockets, runs, streams and isolated runs, and checks
// that goroutines, open files and processes come back to where they were.
func TestGatewayCyclesLeakNothing(t *testing.T) {
	specs := kernelspecs.Load([]string{testkernels.Dir(t)})
	cycle := func() {
		mgr := sessions.New(sessions.Config{PoolSize: 1}, specs, &jupyter.LocalProvisioner{RuntimeDir: t.TempDir()}, nil)
		srv := New(Config{Token: testToken}, mgr, nil)
		hs := httptest.NewServer(srv)
		g := &testGateway{t: t, url: hs.URL, token: testToken, mgr: mgr, srv: srv}

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

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		hs.Close()
		mgr.Close(ctx)
		// The test's own client ends of the websockets.
		c.conn.Close()
		c2.conn.Close()
	}
	cycle() // warm up what the runtime starts once
	before := leakcheck.Snapshot(t)
	for i := 0; i < 3; i++ {
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

//go:build linux

package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"kernelgate/forward"
	"kernelgate/internal/leakcheck"
	"kernelgate/internal/testkernels"
	"kernelgate/kernelspecs"
	"kernelgate/provision/local"
	"kernelgate/runs"
	"kernelgate/sessions"
)

const testClusterSecret = "cluster-secret-of-the-tests-0123456789"

// testOwners is what the tests say each replica owns: kind/id → the
// owner's URL; anything else is local.
type testOwners struct {
	mu    sync.Mutex
	owner map[string]string
}

func (o *testOwners) Owner(_ context.Context, kind Kind, id string) (string, bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if u, ok := o.owner[string(kind)+"/"+id]; ok {
		return u, false, nil
	}
	return "", true, nil
}

func (o *testOwners) set(kind Kind, id, url string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.owner == nil {
		o.owner = map[string]string{}
	}
	o.owner[string(kind)+"/"+id] = url
}

var _ Owners = (*testOwners)(nil)

// replica is a gateway served as kernelgate serves (Server.Serve, over
// the raw connection wrappers), with owners and the cluster secret.
type replica struct {
	*testGateway
	owners *testOwners
	stop   func() // shuts it down; also run at cleanup
}

func newReplica(t *testing.T) *replica {
	t.Helper()
	secret, err := forward.NewSecret([]byte(testClusterSecret))
	if err != nil {
		t.Fatal(err)
	}
	owners := &testOwners{}
	specs := kernelspecs.Load([]string{testkernels.Dir(t)})
	mgr := sessions.New(sessions.Config{}, specs, &local.Provisioner{RuntimeDir: runtimeDir(t)}, nil)
	srv := New(Config{Token: testToken, Owners: owners, ClusterSecret: secret}, mgr, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(l) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			srv.Shutdown(ctx)
			srv.Close(ctx)
			<-served
			mgr.Close(ctx)
		})
	}
	t.Cleanup(stop)
	return &replica{testGateway: &testGateway{t: t, url: "http://" + l.Addr().String(), token: testToken, mgr: mgr, srv: srv},
		owners: owners, stop: stop}
}

// getWith sends a GET with the token and headers, and returns the answer.
func (g *testGateway) getWith(path string, headers map[string]string) (*http.Response, []byte) {
	g.t.Helper()
	req, _ := http.NewRequest("GET", g.url+path, nil)
	req.Header.Set("Authorization", "token "+g.token)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		g.t.Fatal(err)
	}
	return resp, body
}

// TestReplicaForwardsToTheOwner: with B owning a context (its kernel and
// runs), every kind of call sent to A is answered by B, as B answers it.
func TestReplicaForwardsToTheOwner(t *testing.T) {
	a, b := newReplica(t), newReplica(t)
	status, body := b.do("POST", "/api/contexts", map[string]any{"id": "on-b", "language": "python"})
	if status != http.StatusCreated {
		t.Fatalf("create on B: %d %s", status, body)
	}
	kernelID := ""
	if k := decode[sessions.ContextModel](t, body).KernelID; k != nil {
		kernelID = *k
	}
	a.owners.set(KindContext, "on-b", b.url)
	a.owners.set(KindKernel, kernelID, b.url)

	t.Run("execute", func(t *testing.T) {
		status, body := a.do("POST", "/api/execute", map[string]any{"code": "x = 41\nprint(x + 1)", "context": "on-b"})
		if status != http.StatusOK {
			t.Fatalf("execute through A: %d %s", status, body)
		}
		viaA := decode[runs.Execution](t, body)
		viaB := b.run(map[string]any{"code": "print(x + 1)", "context": "on-b"})
		if b4Stdout(viaA) != "42\n" || b4Stdout(viaB) != "42\n" {
			t.Fatalf("stdout through A %q, on B %q: want 42 from both (B's kernel ran A's code)", b4Stdout(viaA), b4Stdout(viaB))
		}
		if _, err := a.mgr.Context("on-b"); err == nil {
			t.Fatal("A made the context itself instead of forwarding")
		}
	})

	t.Run("streamed run and resume", func(t *testing.T) {
		resp := startStream(t, a.testGateway, map[string]any{"code": "for i in range(3): print(i, flush=True)", "context": "on-b"})
		evs := readEvents(t, bufio.NewScanner(resp.Body), func(e event) bool { return e.Type == "end" })
		resp.Body.Close()
		runID := resp.Header.Get("X-Run-Id")
		if len(evs) == 0 || evs[len(evs)-1].Type != "end" || runID == "" {
			t.Fatalf("stream through A: %d events, run %q", len(evs), runID)
		}
		var out strings.Builder
		for _, e := range evs {
			if e.Type == "stdout" {
				out.WriteString(e.Text)
			}
		}
		if out.String() != "0\n1\n2\n" {
			t.Fatalf("stdout %q", out.String())
		}
		a.owners.set(KindRun, runID, b.url)
		for _, accept := range []string{"application/x-ndjson", "text/event-stream"} {
			path := "/api/runs/" + runID + "/events?after=2"
			ra, viaA := a.getWith(path, map[string]string{"Accept": accept})
			rb, onB := b.getWith(path, map[string]string{"Accept": accept})
			if ra.StatusCode != 200 || !bytes.Equal(viaA, onB) || ra.Header.Get("Content-Type") != rb.Header.Get("Content-Type") {
				t.Fatalf("%s resume through A: %d %q\non B: %d %q", accept, ra.StatusCode, viaA, rb.StatusCode, onB)
			}
			if !bytes.Contains(viaA, []byte(`"seq":3`)) || bytes.Contains(viaA, []byte(`"seq":2,`)) {
				t.Fatalf("%s resume after 2: %q", accept, viaA)
			}
		}
		ra, viaA := a.getWith("/api/runs/"+runID, nil)
		_, onB := b.getWith("/api/runs/"+runID, nil)
		if ra.StatusCode != 200 || !bytes.Equal(viaA, onB) {
			t.Fatalf("GET run through A: %d %s\non B: %s", ra.StatusCode, viaA, onB)
		}
	})

	t.Run("kernel websocket", func(t *testing.T) {
		for _, v1 := range []bool{false, true} {
			c := a.mustDial(kernelID, v1)
			if c.v1 != v1 {
				t.Fatalf("v1 subprotocol offered %v, agreed %v", v1, c.v1)
			}
			reply, iopub := c.run("x")
			if got := resultText(t, iopub); got != "41" {
				t.Fatalf("v1=%v: result %q (%s), want B's x", v1, got, summary(append(iopub, reply)))
			}
			c.conn.Close()
		}
	})

	t.Run("files", func(t *testing.T) {
		blob := make([]byte, 3<<20)
		rand.Read(blob)
		status, body := a.doWith("PUT", "/api/contexts/on-b/files/data/blob.bin", blob,
			map[string]string{"Authorization": "token " + testToken, "Content-Type": "application/octet-stream"})
		if status != http.StatusCreated {
			t.Fatalf("upload through A: %d %s", status, body)
		}
		_, viaA := a.getWith("/api/contexts/on-b/files/data/blob.bin", nil)
		_, onB := b.getWith("/api/contexts/on-b/files/data/blob.bin", nil)
		if !bytes.Equal(viaA, blob) || !bytes.Equal(onB, blob) {
			t.Fatalf("download: through A %d bytes, on B %d, uploaded %d", len(viaA), len(onB), len(blob))
		}
		resp, part := a.getWith("/api/contexts/on-b/files/data/blob.bin", map[string]string{"Range": "bytes=10-19"})
		if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(part, blob[10:20]) {
			t.Fatalf("range through A: %d %d bytes", resp.StatusCode, len(part))
		}
		e := b.run(map[string]any{"code": "import os; print(os.path.getsize('data/blob.bin'))", "context": "on-b"})
		if b4Stdout(e) != "3145728\n" {
			t.Fatalf("B's kernel sees %q", b4Stdout(e))
		}
	})

	t.Run("mcp", func(t *testing.T) {
		cs, err := mcpClient(t, a.testGateway, "Bearer "+testToken)
		if err != nil {
			t.Fatal(err)
		}
		res := call(t, cs, "run_code", map[string]any{"code": "print(x * 2)", "context": "on-b"})
		if res.IsError || !strings.Contains(texts(res), "82") {
			t.Fatalf("run_code through A: %v %q", res.IsError, texts(res))
		}
	})
}

// TestReplicaForwardsE2B: a sandbox B made is reached through A, by its
// path on the sandbox API and by E2b-Sandbox-Id on its own servers, with
// E2B's credentials checked by B.
func TestReplicaForwardsE2B(t *testing.T) {
	a, b := newReplica(t), newReplica(t)
	id, tok := e2bSandbox(t, b.testGateway, `{"templateID":"code-interpreter-v1"}`)
	a.owners.set(KindSandbox, id, b.url)
	sbx := map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": tok}
	status, out := a.doWith("POST", "/e2b/execute", `{"code":"y = 6 * 7\nprint(y)"}`, sbx)
	if status != http.StatusOK || !strings.Contains(string(out), `42`) {
		t.Fatalf("execute through A: %d %s", status, out)
	}
	if len(sandboxContexts(t, a.testGateway, id)) != 0 || len(sandboxContexts(t, b.testGateway, id)) == 0 {
		t.Fatal("the sandbox's code ran on A, not on its owner")
	}
	status, out = a.doWith("POST", "/e2b/execute", `{"code":"y"}`, map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": "wrong"})
	if status != http.StatusUnauthorized {
		t.Fatalf("a wrong access token through A: %d %s", status, out)
	}
	for _, path := range []string{"/e2b/sandboxes/" + id, "/e2b/v2/sandboxes/" + id} {
		status, out = a.doWith("GET", path, nil, map[string]string{"X-API-KEY": testToken})
		if status != http.StatusOK || decode[map[string]any](t, out)["sandboxID"] != id {
			t.Fatalf("GET %s through A: %d %s", path, status, out)
		}
	}
}

// TestReplicaRefusesUnsignedForwards: a request that claims to come from a
// replica is refused unless the cluster secret's signature checks, even
// with a valid token; a signed one carries its principal, scopes and all.
func TestReplicaRefusesUnsignedForwards(t *testing.T) {
	b := newReplica(t)
	plain := newGateway(t) // no cluster secret
	other, _ := forward.NewSecret([]byte(strings.Repeat("another secret ", 4)))
	good, _ := forward.NewSecret([]byte(testClusterSecret))
	sign := func(s *forward.Secret, method, path string, p principal, at time.Time) string {
		h := http.Header{}
		s.Sign(h, method, path, encodePrincipal(p), at)
		return h.Get(forward.Header)
	}
	admin := principal{name: "token", scopes: allScopes}
	tests := []struct {
		name      string
		g         *testGateway
		method    string
		path      string
		header    string
		withToken bool
		status    int
		code      string
	}{
		{"forged", b.testGateway, "GET", "/api/contexts", "t=1;p=eyJuYW1lIjoidG9rZW4iLCJzY29wZXMiOjN9;s=AAAA", true, 401, "UNAUTHORIZED"},
		{"other secret", b.testGateway, "GET", "/api/contexts", sign(other, "GET", "/api/contexts", admin, time.Now()), false, 401, "UNAUTHORIZED"},
		{"other path", b.testGateway, "GET", "/api/contexts", sign(good, "GET", "/api/languages", admin, time.Now()), false, 401, "UNAUTHORIZED"},
		{"stale", b.testGateway, "GET", "/api/contexts", sign(good, "GET", "/api/contexts", admin, time.Now().Add(-time.Minute)), false, 401, "UNAUTHORIZED"},
		{"no secret here", plain, "GET", "/api/contexts", sign(good, "GET", "/api/contexts", admin, time.Now()), true, 401, "UNAUTHORIZED"},
		{"e2b forged", b.testGateway, "GET", "/e2b/sandboxes", "t=1;p=;s=AAAA", false, 401, "UNAUTHORIZED"},
		{"signed", b.testGateway, "GET", "/api/contexts", sign(good, "GET", "/api/contexts", admin, time.Now()), false, 200, ""},
		{"signed read-only principal", b.testGateway, "POST", "/api/contexts", sign(good, "POST", "/api/contexts", principal{name: "ro", scopes: ScopeRead}, time.Now()), false, 403, "FORBIDDEN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := map[string]string{forward.Header: tt.header}
			if tt.withToken {
				h["Authorization"] = "token " + testToken
			}
			var body any
			if tt.method == "POST" {
				body = map[string]any{"language": "python"}
			}
			status, out := tt.g.doWith(tt.method, tt.path, body, h)
			if status != tt.status {
				t.Fatalf("%d %s, want %d", status, out, tt.status)
			}
			if tt.code != "" && decode[map[string]any](t, out)["code"] != tt.code {
				t.Fatalf("body %s, want code %s", out, tt.code)
			}
		})
	}
}

// TestReplicaNeverForwardsTwice: a forwarded request for what its receiver
// does not own is refused with NOT_OWNER (ownership moved on the way),
// never sent on; an owner that cannot be reached is UNAVAILABLE.
func TestReplicaNeverForwardsTwice(t *testing.T) {
	a, b := newReplica(t), newReplica(t)
	a.owners.set(KindContext, "ping", b.url)
	b.owners.set(KindContext, "ping", a.url)
	status, body := a.do("POST", "/api/contexts/ping/interrupt", nil)
	if status != http.StatusServiceUnavailable || decode[map[string]any](t, body)["code"] != "NOT_OWNER" {
		t.Fatalf("ping-pong: %d %s, want 503 NOT_OWNER", status, body)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	a.owners.set(KindContext, "gone", "http://"+l.Addr().String())
	l.Close()
	status, body = a.do("POST", "/api/execute", map[string]any{"code": "1", "context": "gone"})
	if status != http.StatusServiceUnavailable || decode[map[string]any](t, body)["code"] != "UNAVAILABLE" {
		t.Fatalf("owner gone: %d %s, want 503 UNAVAILABLE", status, body)
	}
}

// TestReplicaOwnerDiesMidStream: a run streamed through A from its owner
// ends with an error for the client, not a hang, when the owner dies; and
// A, B and their kernels leave nothing behind.
func TestReplicaOwnerDiesMidStream(t *testing.T) {
	cycle := func() {
		a, b := newReplica(t), newReplica(t)
		b.do("POST", "/api/contexts", map[string]any{"id": "slow", "language": "python"})
		a.owners.set(KindContext, "slow", b.url)
		resp := startStream(t, a.testGateway, map[string]any{"code": "import time\nprint('first', flush=True)\ntime.sleep(120)", "context": "slow"})
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		evs := readEvents(t, sc, func(e event) bool { return e.Type == "stdout" })
		if len(evs) == 0 || evs[len(evs)-1].Text != "first\n" {
			t.Fatalf("events before the owner died: %+v", evs)
		}
		model := decode[sessions.ContextModel](t, mustGet(t, b.testGateway, "/api/contexts/slow"))
		a.owners.set(KindKernel, *model.KernelID, b.url)
		ws := a.mustDial(*model.KernelID, true)
		// The owner dies: its connections are cut, the hijacked ones
		// (websockets) too.
		b.srv.http.Close()
		b.srv.mu.Lock()
		for c := range b.srv.conns {
			c.conn.NetConn().Close()
		}
		b.srv.mu.Unlock()
		wsDeadline := time.After(20 * time.Second)
	drain:
		for {
			select {
			case _, open := <-ws.msgs:
				if !open { // its reader saw the connection end
					break drain
				}
			case <-wsDeadline:
				t.Fatal("the websocket relayed through A stays open after its owner died")
			}
		}
		ws.conn.Close()
		done := make(chan error, 1)
		go func() { _, err := io.ReadAll(resp.Body); done <- err }()
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("the stream ended cleanly: the client cannot tell the owner died")
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the client's stream hangs after its owner died")
		}
		b.stop()
		a.stop()
	}
	cycle() // what the runtime starts once
	http.DefaultClient.CloseIdleConnections()
	before := leakcheck.Snapshot(t)
	cycle()
	http.DefaultClient.CloseIdleConnections()
	leakcheck.Check(t, before)
}

//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
)

// listed is what the tests read of an entry of a listing.
type listed struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandboxID"`
	Replica   string `json:"replica"`
	Kernel    struct {
		ID      string `json:"id"`
		Replica string `json:"replica"`
	} `json:"kernel"`
}

// listing GETs a listing through url and returns its entries by id.
func listing(t *testing.T, url, path string) map[string]listed {
	t.Helper()
	var items []listed
	call(t, "GET", url+path, nil, 200, &items)
	out := map[string]listed{}
	for _, it := range items {
		id := it.ID
		if id == "" {
			id = it.SandboxID
		}
		if _, twice := out[id]; twice {
			t.Errorf("GET %s through %s lists %s twice", path, url, id)
		}
		out[id] = it
	}
	return out
}

// TestReplicaListingsAreTheClusters: contexts, kernels, a Jupyter session
// and an E2B sandbox made through different replicas are in the listings
// of every replica, each naming its owner, and the status of each counts
// the cluster's kernels. With one replica frozen, the others' listings
// answer at once and still show what it owns, from the store.
func TestReplicaListingsAreTheClusters(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	gs := startReplicas(t, bin, srv, "listings", 3)
	a, b, c := gs[0], gs[1], gs[2]

	var ca, cb ctxModel
	call(t, "POST", a.url+"api/contexts", map[string]any{"id": "made-on-a", "language": "python"}, 201, &ca)
	call(t, "POST", b.url+"api/contexts", map[string]any{"id": "made-on-b", "language": "python"}, 201, &cb)
	var sess sessionModel
	call(t, "POST", c.url+"api/sessions", map[string]any{"path": "made-on-c.ipynb", "type": "notebook", "kernel": map[string]any{"name": "python3"}}, 201, &sess)
	status, body := e2bDo(t, "POST", b.url+"e2b/sandboxes", map[string]any{"templateID": "code-interpreter-v1"}, e2bKey)
	if status != 201 {
		t.Fatalf("sandbox through B: %d %s", status, body)
	}
	sandbox := itemsOf(t, "["+string(body)+"]")[0].SandboxID

	wantKernels := map[string]string{*ca.KernelID: replicaURL(a), *cb.KernelID: replicaURL(b), sess.Kernel.ID: replicaURL(c)}
	var counts []int
	for _, g := range gs {
		cs := listing(t, g.url, "api/contexts")
		for id, owner := range map[string]*gatewayProcess{"made-on-a": a, "made-on-b": b} {
			if cs[id].Replica != replicaURL(owner) {
				t.Errorf("GET /api/contexts through %s: %s is %+v, want it listed with replica %s", g.url, id, cs[id], replicaURL(owner))
			}
		}
		ks := listing(t, g.url, "api/kernels")
		for id, owner := range wantKernels {
			if ks[id].Replica != owner {
				t.Errorf("GET /api/kernels through %s: kernel %s is %+v, want it listed with replica %s", g.url, id, ks[id], owner)
			}
		}
		ss := listing(t, g.url, "api/sessions")
		if s := ss[sess.ID]; s.Kernel.ID != sess.Kernel.ID || s.Kernel.Replica != replicaURL(c) {
			t.Errorf("GET /api/sessions through %s: the session made through C is %+v", g.url, s)
		}
		status, body := e2bDo(t, "GET", g.url+"e2b/sandboxes", nil, e2bKey)
		if status != 200 || !slices.ContainsFunc(itemsOf(t, string(body)), func(it listed) bool { return it.SandboxID == sandbox }) {
			t.Errorf("GET /e2b/sandboxes through %s: %d %s, want sandbox %s made through B", g.url, status, body, sandbox)
		}
		var st struct{ Kernels int }
		call(t, "GET", g.url+"api/status", nil, 200, &st)
		counts = append(counts, st.Kernels)
		if st.Kernels != len(ks) {
			t.Errorf("GET /api/status through %s counts %d kernels; its listing has %d", g.url, st.Kernels, len(ks))
		}
	}
	if counts[0] < len(wantKernels) || counts[0] != counts[1] || counts[1] != counts[2] {
		t.Errorf("the kernels each replica's status counts: %v, want one count, at least %d", counts, len(wantKernels))
	}

	// C frozen: A's listing answers within its wait for C and shows C's
	// kernel from the store.
	c.cmd.Process.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { c.cmd.Process.Signal(syscall.SIGCONT) })
	start := time.Now()
	var ks []listed
	if _, err := tryCall(a.url+"api/kernels", &ks); err != nil {
		t.Fatalf("GET /api/kernels through A while C is frozen: %v", err)
	}
	if !slices.ContainsFunc(ks, func(k listed) bool { return k.ID == sess.Kernel.ID && k.Replica == replicaURL(c) }) {
		t.Errorf("GET /api/kernels through A while C is frozen (%v): %+v, want C's kernel %s from the store", time.Since(start), ks, sess.Kernel.ID)
	}
}

// itemsOf decodes a JSON array of listed entries.
func itemsOf(t *testing.T, js string) []listed {
	t.Helper()
	var items []listed
	if err := json.Unmarshal([]byte(js), &items); err != nil {
		t.Fatalf("%v: %s", err, js)
	}
	return items
}

// TestReplicaSessionForAnotherReplicasKernel: a Jupyter session made
// through C for the kernel A owns binds that kernel (made by A), rather
// than starting another.
func TestReplicaSessionForAnotherReplicasKernel(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	gs := startReplicas(t, bin, srv, "sessions", 3)
	a, b, c := gs[0], gs[1], gs[2]
	var ca ctxModel
	call(t, "POST", a.url+"api/contexts", map[string]any{"id": "on-a", "language": "python"}, 201, &ca)
	execute(t, a.url, "on-a", "marker = 'set through A'")

	var sess struct {
		ID     string `json:"id"`
		Kernel struct {
			ID      string `json:"id"`
			Replica string `json:"replica"`
		} `json:"kernel"`
	}
	call(t, "POST", c.url+"api/sessions", map[string]any{"path": "on-a.ipynb", "type": "notebook", "kernel": map[string]any{"id": *ca.KernelID}}, 201, &sess)
	if sess.Kernel.ID != *ca.KernelID || sess.Kernel.Replica != replicaURL(a) {
		t.Fatalf("a session made through C for A's kernel %s: kernel %+v, want that kernel, owned by %s", *ca.KernelID, sess.Kernel, replicaURL(a))
	}
	call(t, "GET", b.url+"api/sessions/"+sess.ID, nil, 200, &sess)
	if sess.Kernel.ID != *ca.KernelID {
		t.Errorf("the session through B: kernel %s, want %s", sess.Kernel.ID, *ca.KernelID)
	}
	if got := wsExecute(t, b.url, sess.Kernel.ID, "marker"); got != "'set through A'" {
		t.Errorf("the session's kernel through B's websocket: marker is %q, want the context's", got)
	}
}

// startTokenReplicas is startReplicas for gateways that require token.
func startTokenReplicas(t *testing.T, bin string, srv *pgtest.TB, db, token string, n int) []*gatewayProcess {
	t.Helper()
	url := srv.CreateDB(db)
	secret := filepath.Join(t.TempDir(), "cluster-secret")
	if err := os.WriteFile(secret, []byte(replicaSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var gs []*gatewayProcess
	for range n {
		dirs := newRestartDirs(t)
		gs = append(gs, startGateway(t, bin, "--state-url", url, "--cluster-secret-file", secret,
			"--runtime-dir", dirs.runtime, "--pool-size", "0", "--token", token))
	}
	for _, g := range gs {
		var st replicaStatus
		waitFor(t, func() bool {
			callAs(t, token, "GET", g.url+"api/status", nil, 200, &st)
			return len(st.Replicas) == n
		}, "%s: status %+v, want every replica live", func() []any { return []any{g.url, st} })
	}
	t.Cleanup(func() { stopReplicas(t, gs) })
	return gs
}

// TestReplicaContextTokensClusterWide: a context token minted through A
// works through B and C at once; revoked through B (its context's
// tokens), through C (every context token: also those of a context B
// owns), or its context deleted through C, it is refused by every
// replica.
func TestReplicaContextTokensClusterWide(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	const admin = "replica-admin-token"
	gs := startTokenReplicas(t, bin, srv, "tokens", admin, 3)
	a, b, c := gs[0], gs[1], gs[2]
	callAs(t, admin, "POST", a.url+"api/contexts", map[string]any{"id": "tok", "language": "python"}, 201, nil)
	mintFor := func(g *gatewayProcess, id string) string {
		t.Helper()
		var tok struct{ Token string }
		callAs(t, admin, "POST", g.url+"api/contexts/"+id+"/tokens", map[string]any{"ttl": 600}, 201, &tok)
		return tok.Token
	}
	mint := func(g *gatewayProcess) string { t.Helper(); return mintFor(g, "tok") }
	everywhereOn := func(id, tok string, want int) {
		t.Helper()
		for _, g := range gs {
			callAs(t, tok, "GET", g.url+"api/contexts/"+id, nil, want, nil)
		}
	}
	everywhere := func(tok string, want int) { t.Helper(); everywhereOn("tok", tok, want) }

	t1 := mint(a)
	everywhere(t1, 200)
	var e execution
	callAs(t, t1, "POST", c.url+"api/execute", map[string]any{"context": "tok", "code": "6 * 7"}, 200, &e)
	if e.text() != "42" {
		t.Errorf("6 * 7 with A's context token through C: %+v", e)
	}
	callAs(t, admin, "DELETE", b.url+"api/contexts/tok/tokens", nil, 204, nil)
	everywhere(t1, 401)

	// Every context token at once, through a replica that owns none of
	// their contexts.
	callAs(t, admin, "POST", b.url+"api/contexts", map[string]any{"id": "tok-b", "language": "python"}, 201, nil)
	t2, t3 := mint(c), mintFor(a, "tok-b")
	everywhere(t2, 200)
	everywhereOn("tok-b", t3, 200)
	callAs(t, admin, "DELETE", c.url+"api/context-tokens", nil, 204, nil)
	everywhere(t2, 401)
	everywhereOn("tok-b", t3, 401)

	t4 := mint(c)
	everywhere(t4, 200)
	callAs(t, admin, "DELETE", c.url+"api/contexts/tok", nil, 204, nil)
	everywhere(t4, 401)
}

// TestReplicaSharedContextIsTheClusters: a run without context through
// A, then through B and C (and MCP's run_code through C), runs on one
// shared kernel: the state set through A is read through the others, and
// the shared context is listed once, A's.
func TestReplicaSharedContextIsTheClusters(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	gs := startReplicas(t, bin, srv, "shared-context", 3)
	var e execution
	call(t, "POST", gs[0].url+"api/execute", map[string]any{"language": "python", "code": "x = 7"}, 200, &e)
	for _, g := range gs[1:] {
		call(t, "POST", g.url+"api/execute", map[string]any{"code": "x"}, 200, &e)
		if e.text() != "7" {
			t.Errorf(`{"code":"x"} through %s: %+v, want 7 (the shared kernel A started)`, g.url, e)
		}
	}
	// MCP's run_code without context goes there too.
	mcp, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": "run_code", "arguments": map[string]any{"code": "x * 6"}}})
	req, _ := http.NewRequest("POST", gs[2].url+"mcp", bytes.NewReader(mcp))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(answer), "42") {
		t.Errorf("MCP run_code x * 6 through C: %d %s, want 42 from the shared kernel", resp.StatusCode, answer)
	}
	for _, g := range gs {
		if cs := listing(t, g.url, "api/contexts"); cs["code-python"].Replica != replicaURL(gs[0]) {
			t.Errorf("GET /api/contexts through %s: code-python is %+v, want it A's", g.url, cs["code-python"])
		}
	}
}

// TestReplicaSharedContextRace: A and B take the first run without
// context at the same moment: one of them claims the shared context, the
// other sends its run there, and the cluster has one shared kernel.
func TestReplicaSharedContextRace(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	gs := startReplicas(t, bin, srv, "shared-race", 3)
	pids := make([]string, 2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, g := range gs[:2] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var e execution
			if status := postJSON(g.url+"api/execute", map[string]any{"language": "python", "code": "import os; os.getpid()"}, &e); status != 200 {
				t.Errorf("the first run through %s: %d", g.url, status)
			}
			pids[i] = e.text()
		}()
	}
	close(start)
	wg.Wait()
	if pids[0] == "" || pids[0] != pids[1] {
		t.Fatalf("the runs through A and B at once ran in kernel processes %q and %q, want one shared kernel", pids[0], pids[1])
	}
	var e execution
	call(t, "POST", gs[2].url+"api/execute", map[string]any{"code": "os.getpid()"}, 200, &e)
	if e.text() != pids[0] {
		t.Errorf("a run through C: pid %s, want the shared kernel's %s", e.text(), pids[0])
	}
	var st struct{ Kernels int }
	call(t, "GET", gs[2].url+"api/status", nil, 200, &st)
	if st.Kernels != 1 {
		t.Errorf("the cluster runs %d kernels, want the one shared kernel", st.Kernels)
	}
	if n := strings.Count(strings.Join([]string{gs[0].logs.String(), gs[1].logs.String()}, ""), "kernel started"); n != 1 {
		t.Errorf("A and B started %d kernels between them, want 1", n)
	}
}

// postJSON POSTs body as JSON, decodes a 200's answer into out and
// returns the status (0 when the request failed); for goroutines of a
// test, which must not call t.Fatal.
func postJSON(url string, body, out any) int {
	js, _ := json.Marshal(body)
	client := &http.Client{Timeout: 2 * time.Minute}
	resp, err := client.Post(url, "application/json", bytes.NewReader(js))
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == 200 {
		json.Unmarshal(b, out)
	}
	return resp.StatusCode
}

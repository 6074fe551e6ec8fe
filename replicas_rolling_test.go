//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
)

// front stands for a Kubernetes Service before the replicas: it sends
// each request to the next replica whose GET /readyz last answered 200,
// over keep-alive connections, and drops a replica that refuses the
// connection (nothing sent) for the next one. Every other failure is the
// request's: a POST sent on an idle connection the replica closes as it
// stops fails (a replica leaving answers Connection: close).
type front struct {
	backends []string
	ready    []atomic.Bool
	next     atomic.Uint64
	client   *http.Client // keep-alive, as a proxy's connections to its backends
	stop     chan struct{}
	wg       sync.WaitGroup
}

// newFront starts polling the backends' readiness every 50 ms until
// close.
func newFront(backends []string) *front {
	f := &front{backends: backends, ready: make([]atomic.Bool, len(backends)), stop: make(chan struct{}),
		client: &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}}
	probe := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i, b := range backends {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				resp, err := probe.Get(b + "readyz")
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				f.ready[i].Store(err == nil && resp.StatusCode == 200)
				select {
				case <-f.stop:
					return
				case <-tick.C:
				}
			}
		}()
	}
	return f
}

// anyReady reports whether a replica is ready.
func (f *front) anyReady() bool {
	for i := range f.ready {
		if f.ready[i].Load() {
			return true
		}
	}
	return false
}

func (f *front) close() {
	close(f.stop)
	f.wg.Wait()
	f.client.CloseIdleConnections()
}

// do sends the request to a ready replica and returns the status and
// body; an error once a request was sent (or when no replica is ready
// within 30 s).
func (f *front) do(method, path string, body any) (int, []byte, error) {
	var b []byte
	if body != nil {
		b, _ = json.Marshal(body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		n := f.next.Add(1)
		i := int(n % uint64(len(f.backends)))
		if !f.ready[i].Load() {
			pollUntil(time.Second, f.anyReady)
			continue
		}
		req, _ := http.NewRequest(method, f.backends[i]+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		resp, err := f.client.Do(req)
		var op *net.OpError
		if err != nil && errors.As(err, &op) && op.Op == "dial" {
			f.ready[i].Store(false) // refused: nothing was sent
			continue
		}
		if err != nil {
			return 0, nil, fmt.Errorf("%s %s through %s: %w", method, path, f.backends[i], err)
		}
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return resp.StatusCode, out, fmt.Errorf("%s %s through %s: reading the answer: %w", method, path, f.backends[i], err)
		}
		return resp.StatusCode, out, nil
	}
	return 0, nil, fmt.Errorf("%s %s: no replica ready for 30 s", method, path)
}

// waitAll waits until the front sees every replica ready.
func (f *front) waitAll(t *testing.T) {
	t.Helper()
	waitFor(t, func() bool {
		for i := range f.ready {
			if !f.ready[i].Load() {
				return false
			}
		}
		return true
	}, "the front does not see every replica ready", func() []any { return nil })
}

// call sends a request through the front; anything but a 2xx fails the
// test. The answer is decoded into out unless nil.
func (f *front) call(t *testing.T, method, path string, body any, out any) {
	t.Helper()
	code, b, err := f.do(method, path, body)
	if err != nil || code/100 != 2 {
		t.Fatalf("%s %s: %d %s %v", method, path, code, b, err)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
}

// counterBody is the request running code in a client's context; the
// context "code-python" stands for none (the shared Python context).
func counterBody(id, code string) map[string]any {
	if id == "code-python" {
		return map[string]any{"language": "python", "code": code}
	}
	return map[string]any{"context": id, "code": code}
}

// counters are clients each running `n += 1; n` through a front in a
// context of its own (n = 0 set first), every 25 ms, until halted, and
// counting the runs acknowledged: a client stops at its first failure,
// or at an n that is not its count.
type counters struct {
	fr       *front
	ids      []string
	mu       sync.Mutex
	failures []string
	counts   []int
	stop     chan struct{}
	wg       sync.WaitGroup
	halt     func()
}

// startCounters sets n = 0 in each context through the front and starts
// a client per context; halt (also a cleanup of t) stops them.
func startCounters(t *testing.T, fr *front, ids []string) *counters {
	t.Helper()
	c := &counters{fr: fr, ids: ids, counts: make([]int, len(ids)), stop: make(chan struct{})}
	for _, id := range ids {
		fr.call(t, "POST", "api/execute", counterBody(id, "n = 0"), nil)
	}
	for i, id := range ids {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			pace := time.NewTicker(25 * time.Millisecond) // a steady load, not a wait
			defer pace.Stop()
			for {
				select {
				case <-c.stop:
					return
				case <-pace.C:
				}
				code, b, err := fr.do("POST", "api/execute", counterBody(id, "n += 1; n"))
				if err != nil || code != 200 {
					c.fail("client %s after %d runs: %d %s %v", id, c.counts[i], code, b, err)
					return
				}
				var e execution
				if err := json.Unmarshal(b, &e); err != nil || e.Error != nil || e.Process.Reason != "completed" {
					c.fail("client %s after %d runs: an answer that is no completed run: %s", id, c.counts[i], b)
					return
				}
				c.mu.Lock()
				c.counts[i]++
				n := c.counts[i]
				c.mu.Unlock()
				if e.text() != strconv.Itoa(n) {
					c.fail("client %s: run %d answered n = %s (a run counted twice, or lost)", id, n, e.text())
					return
				}
			}
		}()
	}
	c.halt = sync.OnceFunc(func() {
		close(c.stop)
		c.wg.Wait()
	})
	t.Cleanup(c.halt)
	return c
}

func (c *counters) fail(format string, args ...any) {
	c.mu.Lock()
	c.failures = append(c.failures, fmt.Sprintf(format, args...))
	c.mu.Unlock()
}

func (c *counters) failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.failures) > 0
}

// check halts the clients and checks their histories: no failure, and
// each context's n is its client's count of acknowledged runs (each
// counted once), which is not zero.
func (c *counters) check(t *testing.T) {
	t.Helper()
	c.halt()
	for _, f := range c.failures {
		t.Error(f)
	}
	if len(c.failures) > 0 {
		return
	}
	for i, id := range c.ids {
		var e execution
		c.fr.call(t, "POST", "api/execute", counterBody(id, "n"), &e)
		if e.text() != strconv.Itoa(c.counts[i]) {
			t.Errorf("context %s: n = %s, its client counted %d acknowledged runs", id, e.text(), c.counts[i])
		}
		if c.counts[i] == 0 {
			t.Errorf("client %s had no run acknowledged", id)
		}
	}
	t.Logf("acknowledged runs: %v", c.counts)
}

// rollingReplica is a replica of a rolling restart: what it was started
// with, to start it again on the same address.
type rollingReplica struct {
	g     *gatewayProcess
	args  []string                             // its whole command line, its port included
	start func(args ...string) *gatewayProcess // starts it with args
}

// newRollingReplica starts a replica with start(args...) and keeps its
// command line with its port for a restart on the same address.
func newRollingReplica(start func(args ...string) *gatewayProcess, args ...string) *rollingReplica {
	g := start(args...)
	u, _ := url.Parse(g.url)
	return &rollingReplica{g: g, args: append(slices.Clip(args), "--port", u.Port()), start: start}
}

// rollingURLs are the replicas' URLs, for a front.
func rollingURLs(reps []*rollingReplica) []string {
	var urls []string
	for _, r := range reps {
		urls = append(urls, r.g.url)
	}
	return urls
}

// waitRollingLive waits until each replica sees them all live.
func waitRollingLive(t *testing.T, reps []*rollingReplica) {
	t.Helper()
	for _, r := range reps {
		var st replicaStatus
		waitFor(t, func() bool {
			st = replicaStatus{}
			if _, err := tryCall(r.g.url+"api/status", &st); err != nil {
				return false
			}
			for _, o := range reps {
				if !slices.Contains(st.Replicas, replicaURL(o.g)) {
					return false
				}
			}
			return true
		}, "%s: status %+v, want every replica live", func() []any { return []any{r.g.url, st} })
	}
}

// rollingRestart stops each replica with SIGTERM in turn while the
// clients run, checks it handed its kernels over, starts it again on its
// address and waits until every replica sees it live and the front sees
// it ready, then goes on to the next; it stops early when a client
// failed. around(i), when given, runs before replica i is stopped and
// returns what to check once it exited.
func rollingRestart(t *testing.T, reps []*rollingReplica, fr *front, cs *counters, around func(i int, r *rollingReplica) func()) {
	t.Helper()
	for i, r := range reps {
		after := func() {}
		if around != nil {
			after = around(i, r)
		}
		t0 := time.Now()
		if err := r.g.kill(t, syscall.SIGTERM); err != nil {
			t.Fatalf("replica %d: exit after SIGTERM: %v\n%s", i, err, r.g.logs)
		}
		t.Logf("replica %d stopped in %v", i, time.Since(t0).Round(time.Millisecond))
		if !strings.Contains(r.g.logs.String(), "kernels handed over") {
			t.Errorf("replica %d did not hand its kernels over:\n%s", i, r.g.logs)
		}
		after()
		r.g = r.start(r.args...)
		waitRollingLive(t, reps)
		waitFor(t, func() bool { return fr.ready[i].Load() }, "replica %d is not ready again", func() []any { return []any{i} })
		if cs.failed() {
			break
		}
	}
}

// TestReplicasRollingRestartLosesNothing: three replicas behind a front
// that sends to the ready ones, clients each counting `n += 1` in a
// context of their own, and every replica stopped with SIGTERM and
// started again, one after the other. No request fails, every
// acknowledged run is counted once (each context's n is its client's
// count), every context keeps its kernel process all along, a run in
// progress on the replica stopped is answered, and the kernels' processes
// are alive at the end and reaped once the last replica stops.
func TestReplicasRollingRestartLosesNothing(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	dbURL := srv.CreateDB("rolling")
	secret := filepath.Join(t.TempDir(), "cluster-secret")
	if err := os.WriteFile(secret, []byte(replicaSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	workspaces := t.TempDir()
	start := func(args ...string) *gatewayProcess { return startGateway(t, bin, args...) }
	reps := make([]*rollingReplica, 3)
	runtimes := make([]string, 3)
	for i := range reps {
		runtimes[i] = newRestartDirs(t).runtime
		reps[i] = newRollingReplica(start, "--state-url", dbURL, "--cluster-secret-file", secret, "--runtime-dir", runtimes[i],
			"--workspace-root", workspaces, "--pool-size", "0", "--lease", "2s")
	}
	waitRollingLive(t, reps)
	fr := newFront(rollingURLs(reps))
	defer fr.close()
	fr.waitAll(t)

	// The clients' contexts, spread over the replicas by the front; the
	// slow context is the first replica's, stopped first. The last client
	// runs without a context: on the cluster's shared Python context
	// (code-python), which moves with its kernel too.
	const clients = 4
	call(t, "POST", reps[0].g.url+"api/contexts", map[string]any{"id": "slow", "language": "python"}, 201, nil)
	var ids []string
	for i := range clients - 1 {
		id := "counter-" + strconv.Itoa(i)
		fr.call(t, "POST", "api/contexts", map[string]any{"id": id, "language": "python"}, nil)
		ids = append(ids, id)
	}
	ids = append(ids, "code-python")
	fr.call(t, "POST", "api/execute", counterBody("code-python", "n = 0"), nil)
	before := map[string]ctxModel{}
	owners := map[string]bool{}
	for _, id := range append([]string{"slow"}, ids...) {
		var cm struct {
			ctxModel
			Replica string `json:"replica"`
		}
		fr.call(t, "GET", "api/contexts/"+id, nil, &cm)
		if cm.KernelID == nil || cm.KernelProcessID == nil {
			t.Fatalf("context %s has no kernel: %+v", id, cm)
		}
		before[id] = cm.ctxModel
		owners[cm.Replica] = true
	}
	t.Logf("the contexts' owners: %v", owners)

	cs := startCounters(t, fr, ids)
	rollingRestart(t, reps, fr, cs, func(i int, r *rollingReplica) func() {
		if i != 0 {
			return func() {}
		}
		// A run in progress on the replica stopped is answered.
		slow := make(chan slowAnswer, 1)
		go func() {
			var a slowAnswer
			a.code, a.body, a.err = postJSONRaw(r.g.url+"api/execute", map[string]any{"context": "slow", "code": "import time; time.sleep(3); m = 7; m"})
			slow <- a
		}()
		waitFor(t, func() bool {
			var cm struct{ ExecutionState string }
			_, err := tryCall(r.g.url+"api/contexts/slow", &cm)
			return err == nil && cm.ExecutionState == "busy"
		}, "the slow run did not start", func() []any { return nil })
		return func() {
			a := <-slow
			var e execution
			if a.err != nil || a.code != 200 || json.Unmarshal(a.body, &e) != nil || e.text() != "7" {
				t.Errorf("the run in progress on the replica stopped: %d %s %v, want 200 with 7", a.code, a.body, a.err)
			}
		}
	})
	cs.check(t)
	if t.Failed() {
		for i, r := range reps {
			t.Logf("replica %d:\n%s", i, r.g.logs)
		}
		t.FailNow()
	}

	// Every context on its kernel.
	var pids []int
	for _, id := range append([]string{"slow"}, ids...) {
		var cm ctxModel
		fr.call(t, "GET", "api/contexts/"+id, nil, &cm)
		b := before[id]
		if cm.KernelID == nil || *cm.KernelID != *b.KernelID || cm.KernelProcessID == nil || *cm.KernelProcessID != *b.KernelProcessID {
			t.Errorf("context %s: kernel %v pid %v after the rolling restart, want %s pid %d", id, orNil(cm.KernelID), cm.KernelProcessID, *b.KernelID, *b.KernelProcessID)
		}
		if !processAlive(*b.KernelProcessID) {
			t.Errorf("context %s: its kernel's process %d is gone", id, *b.KernelProcessID)
		}
		pids = append(pids, *b.KernelProcessID)
	}
	// A kernel's websocket works through any replica after the moves.
	if got := wsExecute(t, reps[1].g.url, *before[ids[0]].KernelID, "n"); got != strconv.Itoa(cs.counts[0]) {
		t.Errorf("n through %s's websocket to the kernel of %s: %q, want %d", reps[1].g.url, ids[0], got, cs.counts[0])
	}

	// The replicas stop one after the other; the last one standing
	// shuts the kernels down, and none is left.
	for i, r := range reps {
		if err := r.g.kill(t, syscall.SIGTERM); err != nil {
			t.Errorf("replica %d: exit after SIGTERM: %v\n%s", i, err, r.g.logs)
		}
	}
	if !strings.Contains(reps[len(reps)-1].g.logs.String(), "no other replica serves") {
		t.Errorf("the last replica did not shut down as the last one standing:\n%s", reps[len(reps)-1].g.logs)
	}
	for _, pid := range pids {
		if !pollUntil(30*time.Second, func() bool { return !processAlive(pid) }) {
			t.Errorf("kernel process %d outlived the last replica", pid)
		}
	}
	for _, rt := range runtimes {
		waitProcs(t, rt, true, nil)
	}
}

// slowAnswer is the answer to a run sent straight to a replica.
type slowAnswer struct {
	code int
	body []byte
	err  error
}

// postJSONRaw POSTs body as JSON to url and returns the status and answer.
func postJSONRaw(url string, body any) (int, []byte, error) {
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// orNil shows a string pointer.
func orNil(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

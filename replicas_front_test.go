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
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
)

// What the tests of replicas behind a front share: replicas started on
// one database, the front that stands for a Service before them, and
// clients counting runs in their contexts through it.

// rollingReplica is a replica of a rolling restart: what it was started
// with, to start it again on the same address.
type rollingReplica struct {
	g       *gatewayProcess
	args    []string
	runtime string
}

// startReplicaSet starts n replicas on a database of their own, one
// --workspace-root, with local kernels and a lease of 2 s, and waits
// until each sees them all live.
func startReplicaSet(t *testing.T, bin, db string, n int) []*rollingReplica {
	t.Helper()
	srv := pgtest.Start(t)
	dbURL := srv.CreateDB(db)
	secret := filepath.Join(t.TempDir(), "cluster-secret")
	if err := os.WriteFile(secret, []byte(replicaSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	workspaces := t.TempDir()
	reps := make([]*rollingReplica, n)
	for i := range reps {
		dirs := newRestartDirs(t)
		args := []string{"--state-url", dbURL, "--cluster-secret-file", secret, "--runtime-dir", dirs.runtime,
			"--workspace-root", workspaces, "--pool-size", "0", "--lease", "2s"}
		g := startGateway(t, bin, args...)
		u, _ := url.Parse(g.url)
		reps[i] = &rollingReplica{g: g, args: append(args, "--port", u.Port()), runtime: dirs.runtime}
	}
	waitRollingLive(t, reps)
	return reps
}

// waitRollingLive waits until every replica's status lists them all (a
// status that fails is asked again).
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

// front stands for a Kubernetes Service before the replicas: it sends
// each request to the next replica whose GET /readyz last answered 200,
// over keep-alive connections, and drops a replica that refuses the
// connection (nothing sent) for the next one. Every other failure is the
// request's: a POST sent on an idle connection the replica closes as it
// stops fails.
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

// frontTo starts a front before the replicas and waits until it sees
// them all ready; closed at the test's end.
func frontTo(t *testing.T, reps []*rollingReplica) *front {
	t.Helper()
	var backends []string
	for _, r := range reps {
		backends = append(backends, r.g.url)
	}
	fr := newFront(backends)
	t.Cleanup(fr.close)
	waitFor(t, func() bool {
		for i := range fr.ready {
			if !fr.ready[i].Load() {
				return false
			}
		}
		return true
	}, "the front does not see every replica ready", func() []any { return nil })
	return fr
}

// call sends a request through the front and decodes its 2xx answer
// into out; any other answer fails the test.
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

// runBody is the execute body of code in context id; "code-python" is
// the cluster's shared Python context, named by its language.
func runBody(id, code string) map[string]any {
	if id == "code-python" {
		return map[string]any{"language": "python", "code": code}
	}
	return map[string]any{"context": id, "code": code}
}

// counters are clients each running `n += 1; n` in a context of its
// own through the front until stopped, counting the runs acknowledged
// and checking each answer is the next count.
type counters struct {
	ids    []string
	counts []int // written under mu
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once

	mu    sync.Mutex
	fails []string
}

// startCounters starts a client per context of ids (each set to n = 0
// by the caller).
func startCounters(fr *front, ids []string) *counters {
	c := &counters{ids: ids, counts: make([]int, len(ids)), stop: make(chan struct{})}
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
				code, b, err := fr.do("POST", "api/execute", runBody(id, "n += 1; n"))
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
	return c
}

func (c *counters) fail(format string, args ...any) {
	c.mu.Lock()
	c.fails = append(c.fails, fmt.Sprintf(format, args...))
	c.mu.Unlock()
}

// failed reports whether a client failed.
func (c *counters) failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.fails) > 0
}

// stopAll stops the clients and waits for them; it returns their
// failures.
func (c *counters) stopAll() []string {
	c.once.Do(func() {
		close(c.stop)
		c.wg.Wait()
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fails
}

// checkCounts checks, once the clients stopped, that each context's n is
// its client's count of acknowledged runs, and that each had some.
func (c *counters) checkCounts(t *testing.T, fr *front) {
	t.Helper()
	for i, id := range c.ids {
		var e execution
		fr.call(t, "POST", "api/execute", runBody(id, "n"), &e)
		if e.text() != strconv.Itoa(c.counts[i]) {
			t.Errorf("context %s: n = %s, its client counted %d acknowledged runs", id, e.text(), c.counts[i])
		}
		if c.counts[i] == 0 {
			t.Errorf("client %s had no run acknowledged", id)
		}
	}
}

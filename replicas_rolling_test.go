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

// rollingReplica is a replica of a rolling restart: what it was started
// with, to start it again on the same address.
type rollingReplica struct {
	g       *gatewayProcess
	args    []string
	runtime string
}

// front stands for a Kubernetes Service before the replicas: it sends
// each request to the next replica whose GET /readyz last answered 200,
// and drops a replica that refuses the connection (nothing sent) for the
// next one. Every other failure is the request's.
type front struct {
	backends []string
	ready    []atomic.Bool
	next     atomic.Uint64
	client   *http.Client // no keep-alive: a refused replica is seen at once
	stop     chan struct{}
	wg       sync.WaitGroup
}

// newFront starts polling the backends' readiness every 50 ms until
// close.
func newFront(backends []string) *front {
	f := &front{backends: backends, ready: make([]atomic.Bool, len(backends)), stop: make(chan struct{}),
		client: &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}}
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
	reps := make([]*rollingReplica, 3)
	for i := range reps {
		dirs := newRestartDirs(t)
		args := []string{"--state-url", dbURL, "--cluster-secret-file", secret, "--runtime-dir", dirs.runtime,
			"--workspace-root", workspaces, "--pool-size", "0", "--lease", "2s"}
		g := startGateway(t, bin, args...)
		u, _ := url.Parse(g.url)
		reps[i] = &rollingReplica{g: g, args: append(args, "--port", u.Port()), runtime: dirs.runtime}
	}
	waitAllLive := func() {
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
	waitAllLive()
	var backends []string
	for _, r := range reps {
		backends = append(backends, r.g.url)
	}
	fr := newFront(backends)
	defer fr.close()
	waitFor(t, func() bool {
		for i := range fr.ready {
			if !fr.ready[i].Load() {
				return false
			}
		}
		return true
	}, "the front does not see every replica ready", func() []any { return nil })

	frontCall := func(method, path string, body any, out any) {
		t.Helper()
		code, b, err := fr.do(method, path, body)
		if err != nil || code/100 != 2 {
			t.Fatalf("%s %s: %d %s %v", method, path, code, b, err)
		}
		if out != nil {
			if err := json.Unmarshal(b, out); err != nil {
				t.Fatalf("%s %s: %v: %s", method, path, err, b)
			}
		}
	}
	// The clients' contexts, spread over the replicas by the front; the
	// slow context is the first replica's, stopped first.
	const clients = 4
	ids := []string{"slow"}
	call(t, "POST", reps[0].g.url+"api/contexts", map[string]any{"id": "slow", "language": "python"}, 201, nil)
	// The last client runs without a context: on the cluster's shared
	// Python context (code-python), which moves with its kernel too.
	body := func(id, code string) map[string]any {
		if id == "code-python" {
			return map[string]any{"language": "python", "code": code}
		}
		return map[string]any{"context": id, "code": code}
	}
	for i := range clients {
		id := "counter-" + strconv.Itoa(i)
		if i == clients-1 {
			id = "code-python"
		} else {
			frontCall("POST", "api/contexts", map[string]any{"id": id, "language": "python"}, nil)
		}
		ids = append(ids, id)
		frontCall("POST", "api/execute", body(id, "n = 0"), nil)
	}
	before := map[string]ctxModel{}
	owners := map[string]bool{}
	for _, id := range ids {
		var cm struct {
			ctxModel
			Replica string `json:"replica"`
		}
		frontCall("GET", "api/contexts/"+id, nil, &cm)
		if cm.KernelID == nil || cm.KernelProcessID == nil {
			t.Fatalf("context %s has no kernel: %+v", id, cm)
		}
		before[id] = cm.ctxModel
		owners[cm.Replica] = true
	}
	t.Logf("the contexts' owners: %v", owners)

	// The clients: each runs n += 1 in its context until told to stop,
	// counting the runs acknowledged.
	var mu sync.Mutex
	var failures []string
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	counts := make([]int, clients)
	stopClients := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := ids[i+1]
			pace := time.NewTicker(25 * time.Millisecond) // a steady load, not a wait
			defer pace.Stop()
			for {
				select {
				case <-stopClients:
					return
				case <-pace.C:
				}
				code, b, err := fr.do("POST", "api/execute", body(id, "n += 1; n"))
				if err != nil || code != 200 {
					fail("client %s after %d runs: %d %s %v", id, counts[i], code, b, err)
					return
				}
				var e execution
				if err := json.Unmarshal(b, &e); err != nil || e.Error != nil || e.Process.Reason != "completed" {
					fail("client %s after %d runs: an answer that is no completed run: %s", id, counts[i], b)
					return
				}
				counts[i]++
				if e.text() != strconv.Itoa(counts[i]) {
					fail("client %s: run %d answered n = %s (a run counted twice, or lost)", id, counts[i], e.text())
					return
				}
			}
		}()
	}
	stopAll := sync.OnceFunc(func() {
		close(stopClients)
		wg.Wait()
	})
	defer stopAll()

	// The rolling restart: each replica stopped with SIGTERM while the
	// clients run, started again on its address, ready, then the next.
	for i, r := range reps {
		var slow chan slowAnswer
		if i == 0 {
			// A run in progress on the replica stopped is answered.
			slow = make(chan slowAnswer, 1)
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
		}
		t0 := time.Now()
		if err := r.g.kill(t, syscall.SIGTERM); err != nil {
			t.Fatalf("replica %d: exit after SIGTERM: %v\n%s", i, err, r.g.logs)
		}
		t.Logf("replica %d stopped in %v", i, time.Since(t0).Round(time.Millisecond))
		if !strings.Contains(r.g.logs.String(), "kernels handed over") {
			t.Errorf("replica %d did not hand its kernels over:\n%s", i, r.g.logs)
		}
		if slow != nil {
			a := <-slow
			var e execution
			if a.err != nil || a.code != 200 || json.Unmarshal(a.body, &e) != nil || e.text() != "7" {
				t.Errorf("the run in progress on the replica stopped: %d %s %v, want 200 with 7", a.code, a.body, a.err)
			}
		}
		r.g = startGateway(t, bin, r.args...)
		waitAllLive()
		waitFor(t, func() bool { return fr.ready[i].Load() }, "replica %d is not ready again", func() []any { return []any{i} })
		mu.Lock()
		stop := len(failures) > 0
		mu.Unlock()
		if stop {
			break
		}
	}
	stopAll()
	for _, f := range failures {
		t.Error(f)
	}
	if t.Failed() {
		for i, r := range reps {
			t.Logf("replica %d:\n%s", i, r.g.logs)
		}
		t.FailNow()
	}

	// Every acknowledged run counted once; every context on its kernel.
	for i := range clients {
		var e execution
		frontCall("POST", "api/execute", body(ids[i+1], "n"), &e)
		if e.text() != strconv.Itoa(counts[i]) {
			t.Errorf("context %s: n = %s, its client counted %d acknowledged runs", ids[i+1], e.text(), counts[i])
		}
		if counts[i] == 0 {
			t.Errorf("client %s had no run acknowledged", ids[i+1])
		}
	}
	var pids []int
	for _, id := range ids {
		var cm ctxModel
		frontCall("GET", "api/contexts/"+id, nil, &cm)
		b := before[id]
		if cm.KernelID == nil || *cm.KernelID != *b.KernelID || cm.KernelProcessID == nil || *cm.KernelProcessID != *b.KernelProcessID {
			t.Errorf("context %s: kernel %v pid %v after the rolling restart, want %s pid %d", id, orNil(cm.KernelID), cm.KernelProcessID, *b.KernelID, *b.KernelProcessID)
		}
		if !processAlive(*b.KernelProcessID) {
			t.Errorf("context %s: its kernel's process %d is gone", id, *b.KernelProcessID)
		}
		pids = append(pids, *b.KernelProcessID)
	}
	t.Logf("acknowledged runs: %v", counts)
	// A kernel's websocket works through any replica after the moves.
	if got := wsExecute(t, reps[1].g.url, *before[ids[1]].KernelID, "n"); got != strconv.Itoa(counts[0]) {
		t.Errorf("n through %s's websocket to the kernel of %s: %q, want %d", reps[1].g.url, ids[1], got, counts[0])
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
	for _, r := range reps {
		waitProcs(t, r.runtime, true, nil)
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

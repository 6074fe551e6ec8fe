//go:build linux

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
)

// attempt is one run a client of TestReplicasPostgresRestarted asked for.
type attempt struct {
	via        string // the replica asked
	streamed   bool
	status     int    // 0: no answer within the client's bound
	retryAfter string // of a 503
	run        string // the run's id, once known
	reason     string // its end's process.reason; "" when no end came
	value      string // the run's result
	err        error
	at         time.Time
	took       time.Duration
}

// acked says the run was acknowledged: answered, ended, completed.
func (a attempt) acked() bool {
	return a.err == nil && a.status == 200 && a.reason == "completed" && a.value != ""
}

// pgRestartClientBound bounds every request of the clients: an answer
// (or a stream's end) within it, or the request hung.
const pgRestartClientBound = 40 * time.Second

// runOnce runs code in the context through the replica at url, waited
// (one JSON answer) or streamed (NDJSON to the end event).
func runOnce(url, context, code string, streamed bool) (a attempt) {
	a = attempt{via: url, streamed: streamed, at: time.Now()}
	defer func() { a.took = time.Since(a.at) }()
	body, _ := json.Marshal(map[string]any{"context": context, "code": code})
	req, _ := http.NewRequest("POST", url+"api/execute", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if streamed {
		req.Header.Set("Accept", "application/x-ndjson")
	}
	client := &http.Client{Timeout: pgRestartClientBound}
	resp, err := client.Do(req)
	if err != nil {
		a.err = err
		return a
	}
	defer resp.Body.Close()
	a.status = resp.StatusCode
	a.retryAfter = resp.Header.Get("Retry-After")
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		a.err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
		return a
	}
	if !streamed {
		var e struct {
			ID string `json:"id"`
			execution
		}
		if a.err = json.NewDecoder(resp.Body).Decode(&e); a.err == nil {
			a.run, a.reason, a.value = e.ID, e.Process.Reason, e.text()
		}
		return a
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev struct {
			Type    string `json:"type"`
			Run     string `json:"run"`
			Text    string `json:"text"`
			Process struct {
				Reason string `json:"reason"`
			} `json:"process"`
		}
		json.Unmarshal(sc.Bytes(), &ev)
		switch ev.Type {
		case "start":
			a.run = ev.Run
		case "result":
			a.value = ev.Text
		case "end":
			a.reason = ev.Process.Reason
			return a
		}
	}
	a.err = fmt.Errorf("the stream ended without its end event: %v", sc.Err())
	return a
}

// pgClients are clients of TestReplicasPostgresRestarted: one per
// context, each running `n += 1; n` through the replicas in turn,
// waited and streamed runs alternating, until halted, keeping every
// attempt.
type pgClients struct {
	names   []string
	mu      sync.Mutex
	history map[string][]attempt
	stop    chan struct{}
	wg      sync.WaitGroup
	halt    func()
}

// startPgClients starts a client per context over the replicas at urls;
// halt (also a cleanup of t) stops them.
func startPgClients(t *testing.T, urls, names []string) *pgClients {
	c := &pgClients{names: names, history: map[string][]attempt{}, stop: make(chan struct{})}
	for i, name := range names {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			for k := 0; k < 2000; k++ {
				select {
				case <-c.stop:
					return
				default:
				}
				a := runOnce(urls[(i+k)%len(urls)], name, "n += 1; n", k%2 == 1)
				c.mu.Lock()
				c.history[name] = append(c.history[name], a)
				c.mu.Unlock()
				if a.status == 503 {
					// Told to come back: a client waits a little.
					select {
					case <-c.stop:
						return
					case <-time.After(200 * time.Millisecond):
					}
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

// ackedSince is the least, over the contexts, of the acknowledged runs
// asked for after t0.
func (c *pgClients) ackedSince(t0 time.Time) (least int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	least = -1
	for _, name := range c.names {
		n := 0
		for _, a := range c.history[name] {
			if a.acked() && a.at.After(t0) {
				n++
			}
		}
		if least < 0 || n < least {
			least = n
		}
	}
	return least
}

// pgOutage stops PostgreSQL at once (as a crash would) and keeps it down
// past the lease, until each replica of gs that owns a context of was
// said it cannot renew its leases and then failed to renew them once
// more (the database's lapse has passed); then starts it again. It
// returns when it went down and came back.
func pgOutage(t *testing.T, srv *pgtest.TB, gs []*gatewayProcess, was map[string]pgBefore) (down, up time.Time) {
	t.Helper()
	srv.Stop("immediate")
	down = time.Now()
	var waiting []string
	waitFor(t, func() bool {
		waiting = nil
		for _, g := range gs {
			holds := false
			for _, b := range was {
				holds = holds || b.owner == replicaURL(g)
			}
			logs := g.logs.String()
			i := strings.Index(logs, "cluster: kernel leases")
			if holds && (i < 0 || !(strings.Contains(logs[i:], "renewing leases failed") || strings.Contains(logs, "kernel lease lost"))) {
				waiting = append(waiting, g.url)
			}
		}
		return len(waiting) == 0
	}, "the replicas %v did not notice the database's absence past the lease", func() []any { return []any{waiting} })
	srv.StartAgain()
	up = time.Now()
	t.Logf("PostgreSQL was down for %v", up.Sub(down).Round(time.Millisecond))
	return down, up
}

// pgBefore is a context's owner and kernel before the outage.
type pgBefore struct{ owner, kernel string }

// pgOwners reads each context's owner and kernel through g.
func pgOwners(t *testing.T, g *gatewayProcess, names []string) map[string]pgBefore {
	t.Helper()
	was := map[string]pgBefore{}
	for _, name := range names {
		var cm struct{ KernelID, Replica string }
		call(t, "GET", g.url+"api/contexts/"+name, nil, 200, &cm)
		was[name] = pgBefore{cm.Replica, cm.KernelID}
	}
	return was
}

// checkOutage waits until the clients get runs again after the restart,
// halts them, and checks their histories: every request of the outage
// answered within the bound (a 503 UNAVAILABLE with Retry-After, or its
// run), every other one acknowledged, the acknowledged n growing; each
// context keeps its owner, kernel and state (was) through every replica;
// every acknowledged run answers GET /api/runs/{id} from any replica; no
// replica let a kernel go.
func (c *pgClients) checkOutage(t *testing.T, gs []*gatewayProcess, was map[string]pgBefore, down, up time.Time) {
	t.Helper()
	if !pollUntil(60*time.Second, func() bool { return c.ackedSince(up) >= 4 }) {
		c.halt()
		t.Fatalf("the clients did not get runs again within 60 s of the restart: %s", summary(c.history))
	}
	c.halt()

	during := map[string]int{}
	var longest time.Duration
	for _, hist := range c.history {
		for _, a := range hist {
			if a.at.After(down) && a.at.Before(up) {
				during[fmt.Sprintf("%d %s", a.status, a.reason)]++
				longest = max(longest, a.took)
			}
		}
	}
	t.Logf("answers to the requests made during the outage: %v; the longest took %v", during, longest.Round(time.Millisecond))
	for _, name := range c.names {
		hist := c.history[name]
		last := 0
		for _, a := range hist {
			switch {
			case a.acked():
				var v int
				fmt.Sscan(a.value, &v)
				if v <= last {
					t.Errorf("context %s: run %s through %s gave n = %s after an earlier run gave %d (its state was lost or run twice)", name, a.run, a.via, a.value, last)
				}
				last = v
			case a.status == 0:
				t.Errorf("context %s: a request through %s at +%v hung past %v: %v", name, a.via, a.at.Sub(down).Round(time.Millisecond), pgRestartClientBound, a.err)
			case a.status == 503:
				if a.retryAfter == "" {
					t.Errorf("context %s: a 503 through %s without Retry-After: %v", name, a.via, a.err)
				}
			case a.at.After(up):
				t.Errorf("context %s: a run through %s after the restart failed: status %d, end %q: %v", name, a.via, a.status, a.reason, a.err)
			case a.at.After(down):
				// During the outage an answer other than 503 must be its run's.
				if a.status != 200 {
					t.Errorf("context %s: a run through %s during the outage: status %d: %v (want 503 or its run)", name, a.via, a.status, a.err)
				}
			default:
				t.Errorf("context %s: a run through %s before the outage failed: status %d, end %q: %v", name, a.via, a.status, a.reason, a.err)
			}
		}
		// Its owner, its kernel and its state are those of before.
		for _, g := range gs {
			if now := pgOwners(t, g, []string{name})[name]; now != was[name] {
				t.Errorf("context %s through %s: owner %s, kernel %s; before the outage %s, %s", name, g.url, now.owner, now.kernel, was[name].owner, was[name].kernel)
			}
		}
		var e execution
		call(t, "POST", gs[0].url+"api/execute", map[string]any{"context": name, "code": "n"}, 200, &e)
		var n int
		if _, err := fmt.Sscan(e.text(), &n); err != nil || n < last {
			t.Errorf("context %s: n is %q after the outage, want at least %d (the last acknowledged)", name, e.text(), last)
		}
		// Every acknowledged run is in the store, answered by any replica.
		for _, a := range hist {
			if !a.acked() {
				continue
			}
			for _, g := range gs {
				var got struct {
					State     string    `json:"state"`
					Execution execution `json:"execution"`
				}
				call(t, "GET", g.url+"api/runs/"+a.run, nil, 200, &got)
				if got.State != "done" || got.Execution.text() != a.value {
					t.Errorf("run %s (context %s, acknowledged n = %s) through %s: state %q, result %q", a.run, name, a.value, g.url, got.State, got.Execution.text())
				}
			}
		}
	}
	for i, g := range gs {
		if strings.Contains(g.logs.String(), "kernel lease lost") {
			t.Errorf("replica %d let a kernel go because of the outage:\n%s", i, g.logs)
		}
	}
}

// TestReplicasPostgresRestarted: three replicas with local kernels, a
// client per context running code in a loop through every replica in
// turn (waited and streamed), and PostgreSQL stopped for longer than the
// lease, then started again. The replicas reconnect and go on: every
// request of the outage was answered within a bound (a 503 UNAVAILABLE
// with Retry-After, or its run); no replica let a kernel go or took
// another's over because of the outage (each context keeps its owner,
// its kernel and its state); every run acknowledged before, during and
// after is in the store and answers GET /api/runs/{id} from any replica.
func TestReplicasPostgresRestarted(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	gs := startReplicas(t, bin, srv, "pgrestart", 3, "--lease", "2s")

	names := []string{"one", "two", "three"}
	var urls []string
	for i, name := range names {
		call(t, "POST", gs[i].url+"api/contexts", map[string]any{"id": name, "language": "python"}, 201, nil)
		var e execution
		call(t, "POST", gs[i].url+"api/execute", map[string]any{"context": name, "code": "n = 0"}, 200, &e)
		urls = append(urls, gs[i].url)
	}
	was := pgOwners(t, gs[0], names)
	for i, name := range names {
		if was[name].owner != replicaURL(gs[i]) {
			t.Fatalf("context %s created through %s is owned by %s", name, gs[i].url, was[name].owner)
		}
	}

	cs := startPgClients(t, urls, names)
	waitFor(t, func() bool { return cs.ackedSince(time.Time{}) >= 3 }, "the clients got fewer than 3 runs each before the outage", func() []any { return nil })
	down, up := pgOutage(t, srv, gs, was)
	cs.checkOutage(t, gs, was, down, up)
}

// summary is a short account of the clients' attempts.
func summary(history map[string][]attempt) string {
	var b strings.Builder
	for name, hist := range history {
		fmt.Fprintf(&b, "\n%s:", name)
		for _, a := range hist[max(0, len(hist)-8):] {
			fmt.Fprintf(&b, " [%d %s %v]", a.status, a.reason, a.err)
		}
	}
	return b.String()
}

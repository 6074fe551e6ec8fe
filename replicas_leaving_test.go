//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"kernelgate/internal/pgtest"
)

// TestReplicasStoppedTogetherHandToTheOneLeft: three replicas behind a
// front, clients counting `n += 1` in contexts two on each replica and
// one on the third, and the first two stopped with SIGTERM at the same
// moment while the third serves. A replica that is stopping is handed no
// kernel: every kernel goes to the third replica, at once, with its
// process; no request fails and every acknowledged run is counted once.
func TestReplicasStoppedTogetherHandToTheOneLeft(t *testing.T) {
	bin := buildBinary(t)
	reps := startReplicaSet(t, bin, "leaving", 3)
	fr := frontTo(t, reps)
	t.Cleanup(func() {
		if t.Failed() {
			for i, r := range reps {
				t.Logf("replica %d:\n%s", i, r.g.logs)
			}
		}
	})
	// Two contexts on each replica stopped (each hands one to each of
	// its peers when it counts them both), one on the replica left.
	var ids []string
	for i, r := range reps {
		for j := range 2 {
			if i == 2 && j == 1 {
				break
			}
			id := "leaving-" + string(rune('a'+i)) + string(rune('0'+j))
			call(t, "POST", r.g.url+"api/contexts", map[string]any{"id": id, "language": "python"}, 201, nil)
			ids = append(ids, id)
		}
	}
	before := map[string]ctxModel{}
	for _, id := range ids {
		var cm ctxModel
		fr.call(t, "GET", "api/contexts/"+id, nil, &cm)
		if cm.KernelID == nil || cm.KernelProcessID == nil {
			t.Fatalf("context %s has no kernel: %+v", id, cm)
		}
		before[id] = cm
	}

	cl := startCounters(t, fr, ids)
	// Some runs acknowledged before the stop.
	waitFor(t, func() bool { return minCount(cl) >= 3 || cl.failed() }, "the clients have no runs acknowledged", func() []any { return nil })

	// The first two replicas stopped at the same moment.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, r := range reps[:2] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.g.kill(t, syscall.SIGTERM)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: exit after SIGTERM: %v", i, err)
		}
		if !strings.Contains(reps[i].g.logs.String(), "kernels handed over") {
			t.Errorf("replica %d did not hand its kernels over", i)
		}
	}
	// The clients go on through the replica left.
	after := slicesClone(cl)
	waitFor(t, func() bool {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		for i := range after {
			if cl.counts[i] < after[i]+3 && len(cl.failures) == 0 {
				return false
			}
		}
		return true
	}, "the clients have no runs acknowledged after the stop: %v, %v before", func() []any { return []any{slicesClone(cl), after} })
	cl.check(t)
	if t.Failed() {
		t.FailNow()
	}

	// Every kernel is the third replica's, with its process.
	left := replicaURL(reps[2].g)
	for _, id := range ids {
		var cm struct {
			ctxModel
			Replica string `json:"replica"`
		}
		call(t, "GET", reps[2].g.url+"api/contexts/"+id, nil, 200, &cm)
		b := before[id]
		if cm.Replica != left {
			t.Errorf("context %s is owned by %q, want the replica left, %s", id, cm.Replica, left)
		}
		if cm.KernelID == nil || *cm.KernelID != *b.KernelID || cm.KernelProcessID == nil || *cm.KernelProcessID != *b.KernelProcessID {
			t.Errorf("context %s: kernel %v pid %v, want %s pid %d", id, orNil(cm.KernelID), cm.KernelProcessID, *b.KernelID, *b.KernelProcessID)
		}
	}
}

// minCount is the fewest runs a client had acknowledged.
func minCount(c *counters) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := -1
	for _, k := range c.counts {
		if n < 0 || k < n {
			n = k
		}
	}
	return n
}

// slicesClone is a copy of the clients' counts now.
func slicesClone(c *counters) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.counts...)
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
	start := func(args ...string) *gatewayProcess { return startGateway(t, bin, args...) }
	reps := make([]*rollingReplica, n)
	for i := range reps {
		dirs := newRestartDirs(t)
		reps[i] = newRollingReplica(start, "--state-url", dbURL, "--cluster-secret-file", secret, "--runtime-dir", dirs.runtime,
			"--workspace-root", workspaces, "--pool-size", "0", "--lease", "2s")
	}
	waitRollingLive(t, reps)
	return reps
}

// frontTo starts a front before the replicas and waits until it sees
// them all ready; closed at the test's end.
func frontTo(t *testing.T, reps []*rollingReplica) *front {
	t.Helper()
	fr := newFront(rollingURLs(reps))
	t.Cleanup(fr.close)
	fr.waitAll(t)
	return fr
}

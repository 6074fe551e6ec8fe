//go:build linux

package main

import (
	"strings"
	"sync"
	"syscall"
	"testing"
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
			call(t, "POST", r.g.url+"api/execute", runBody(id, "n = 0"), 200, nil)
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

	cl := startCounters(fr, ids)
	defer cl.stopAll()
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
			if cl.counts[i] < after[i]+3 && len(cl.fails) == 0 {
				return false
			}
		}
		return true
	}, "the clients have no runs acknowledged after the stop: %v, %v before", func() []any { return []any{slicesClone(cl), after} })
	for _, f := range cl.stopAll() {
		t.Error(f)
	}
	if t.Failed() {
		t.FailNow()
	}
	cl.checkCounts(t, fr)

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
	t.Logf("acknowledged runs: %v", cl.counts)
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

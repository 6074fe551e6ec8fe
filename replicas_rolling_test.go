//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

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
	reps := startReplicaSet(t, bin, "rolling", 3)
	fr := frontTo(t, reps)
	frontCall := func(method, path string, body any, out any) {
		t.Helper()
		fr.call(t, method, path, body, out)
	}
	// The clients' contexts, spread over the replicas by the front; the
	// slow context is the first replica's, stopped first.
	const clients = 4
	ids := []string{"slow"}
	call(t, "POST", reps[0].g.url+"api/contexts", map[string]any{"id": "slow", "language": "python"}, 201, nil)
	// The last client runs without a context: on the cluster's shared
	// Python context (code-python), which moves with its kernel too.
	body := runBody
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
	cl := startCounters(fr, ids[1:])
	defer cl.stopAll()

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
		waitRollingLive(t, reps)
		waitFor(t, func() bool { return fr.ready[i].Load() }, "replica %d is not ready again", func() []any { return []any{i} })
		if cl.failed() {
			break
		}
	}
	for _, f := range cl.stopAll() {
		t.Error(f)
	}
	if t.Failed() {
		for i, r := range reps {
			t.Logf("replica %d:\n%s", i, r.g.logs)
		}
		t.FailNow()
	}

	// Every acknowledged run counted once; every context on its kernel.
	cl.checkCounts(t, fr)
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
	t.Logf("acknowledged runs: %v", cl.counts)
	// A kernel's websocket works through any replica after the moves.
	if got := wsExecute(t, reps[1].g.url, *before[ids[1]].KernelID, "n"); got != strconv.Itoa(cl.counts[0]) {
		t.Errorf("n through %s's websocket to the kernel of %s: %q, want %d", reps[1].g.url, ids[1], got, cl.counts[0])
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

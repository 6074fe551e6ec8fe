//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"kernelgate/internal/pgtest"
)

// The client of these tests keeps a history (Jepsen's habit): every run
// it sends through B increments n in a context A owns and returns it,
// and A is killed or frozen with runs in flight. Every request must be
// answered, and n must end equal to the number of runs sent: each run
// executed exactly once, whichever replica ended up sending it.

// countRun is one run of the history: its answer.
type countRun struct {
	e      execution
	status int
	err    error
}

// postRun POSTs a waited run of code to context through url.
func postRun(url, context, code string) countRun {
	b, _ := json.Marshal(map[string]any{"context": context, "code": code})
	client := &http.Client{Timeout: 120 * time.Second}
	resp, err := client.Post(url+"api/execute", "application/json", bytes.NewReader(b))
	if err != nil {
		return countRun{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return countRun{status: resp.StatusCode, err: err}
	}
	if resp.StatusCode != 200 {
		return countRun{status: resp.StatusCode, err: fmt.Errorf("%s: %s", resp.Status, body)}
	}
	var e execution
	return countRun{e: e, status: 200, err: json.Unmarshal(body, &e)}
}

// inFlight sends runs through url in the background; wait returns their
// answers.
func inFlight(url, context string, codes ...string) (wait func() []countRun) {
	out := make([]chan countRun, len(codes))
	for i, code := range codes {
		out[i] = make(chan countRun, 1)
		go func() { out[i] <- postRun(url, context, code) }()
	}
	return func() []countRun {
		var rs []countRun
		for _, ch := range out {
			rs = append(rs, <-ch)
		}
		return rs
	}
}

// contextState is what the tests read of a context through a replica.
type contextState struct {
	Replica        string   `json:"replica"`
	ExecutionState string   `json:"executionState"`
	ProcessIDs     []string `json:"processIds"`
	KernelID       string   `json:"kernelId"`
}

// waitBusyWithQueued waits until the owner shows the context busy with
// want more runs than before (the one running and those queued behind).
func waitBusyWithQueued(t *testing.T, owner *gatewayProcess, context string, before, want int) {
	t.Helper()
	var cs contextState
	waitFor(t, func() bool {
		cs = contextState{}
		_, err := tryCall(owner.url+"api/contexts/"+context, &cs)
		return err == nil && cs.ExecutionState == "busy" && len(cs.ProcessIDs) >= before+want
	}, "the owner never showed %d runs in flight: %+v", func() []any { return []any{want, cs} })
}

// replicaCounts sets n = 0 in a context created through A, and returns
// the replicas (the owner first) and the number of runs recorded.
func replicaCounts(t *testing.T, db string) (gs []*gatewayProcess, url string) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	gs = startReplicas(t, bin, srv, db, 3, "--lease", "2s")
	call(t, "POST", gs[0].url+"api/contexts", map[string]any{"id": "counter", "language": "python"}, 201, nil)
	if e := execute(t, gs[1].url, "counter", "n = 0"); e.Process.Reason != "completed" {
		t.Fatalf("n = 0 through B: %+v", e)
	}
	return gs, strings.Replace(srv.URL(), "/postgres?", "/"+db+"?", 1)
}

// checkHistory checks each answered run's n against its place in the
// history, and that the context's n is the number of runs sent.
func checkHistory(t *testing.T, through *gatewayProcess, sent int, history []countRun) {
	t.Helper()
	seen := map[string]bool{}
	for i, r := range history {
		if r.err != nil {
			t.Errorf("run %d: the client got no answer: %v", i+1, r.err)
			continue
		}
		if v := r.e.text(); v != "" {
			if seen[v] {
				t.Errorf("run %d: n = %s was answered twice: a run counted twice", i+1, v)
			}
			seen[v] = true
		} else if !strings.Contains(strings.Join(r.e.Logs.Stderr, ""), "[kernelgate]") {
			t.Errorf("run %d: answered without its n and without the lost-output marker: %+v", i+1, r.e)
		}
	}
	e := execute(t, through.url, "counter", "n")
	if got := e.text(); got != strconv.Itoa(sent) {
		t.Errorf("n = %s after %d runs sent, want %d: each run executed exactly once (%+v)", got, sent, sent, e)
	}
}

// TestReplicasForwardedRunsSurviveOwnerSIGKILL: runs sent through B to a
// context A owns, A SIGKILLed with one run executing and one queued
// behind it: both clients are answered (by the replica that takes the
// kernel over, which follows the first and sends the second), no
// request fails, and n counts every run once.
func TestReplicasForwardedRunsSurviveOwnerSIGKILL(t *testing.T) {
	gs, _ := replicaCounts(t, "fwdkill")
	a, b, c := gs[0], gs[1], gs[2]
	checkForwardedCommands(t, b, "counter")
	var history []countRun
	for range 3 {
		history = append(history, postRun(b.url, "counter", "n += 1; n"))
	}
	var cs contextState
	call(t, "GET", a.url+"api/contexts/counter", nil, 200, &cs)
	wait := inFlight(b.url, "counter", "import time; time.sleep(2); n += 1; n")
	waitBusyWithQueued(t, a, "counter", len(cs.ProcessIDs), 1)
	wait2 := inFlight(b.url, "counter", "n += 1; n")
	waitBusyWithQueued(t, a, "counter", len(cs.ProcessIDs), 2)
	a.kill(t, syscall.SIGKILL)
	// A read through C, sent while the dead owner still holds the
	// lease, is answered by the next owner, not refused.
	checkAnsweredElsewhere(t, c, "counter", a)
	history = append(history, wait()...)
	history = append(history, wait2()...)
	for range 2 {
		history = append(history, postRun(b.url, "counter", "n += 1; n"))
	}
	history = append(history, postRun(c.url, "counter", "n += 1; n"))
	checkHistory(t, b, len(history), history)
	if t.Failed() {
		t.Logf("B:\n%s\nC:\n%s", b.logs, c.logs)
	}
}

// checkForwardedCommands runs a waited command and a background one
// through g, a replica that does not own the context: both run on the
// owner under the id the forwarding replica gave them.
func checkForwardedCommands(t *testing.T, g *gatewayProcess, context string) {
	t.Helper()
	var e execution
	call(t, "POST", g.url+"api/contexts/"+context+"/commands", map[string]any{"cmd": "echo hi"}, 200, &e)
	if e.Process.Reason != "completed" || strings.Join(e.Logs.Stdout, "") != "hi\n" {
		t.Errorf("a command through %s: %+v, want hi, completed", g.url, e)
	}
	var bg struct{ Run string }
	call(t, "POST", g.url+"api/contexts/"+context+"/commands", map[string]any{"cmd": "echo bg", "background": true}, 202, &bg)
	var rm struct {
		State     string
		Execution execution
	}
	waitFor(t, func() bool {
		call(t, "GET", g.url+"api/runs/"+bg.Run, nil, 200, &rm)
		return rm.State == "done"
	}, "the background command %s never ended: %+v", func() []any { return []any{bg.Run, rm} })
	if strings.Join(rm.Execution.Logs.Stdout, "") != "bg\n" {
		t.Errorf("the background command through %s: %+v, want bg", g.url, rm)
	}
}

// TestReplicasForwardedRunsSurviveFrozenOwner: A SIGSTOPped with a run
// executing and one queued behind it, both sent through B: the clients
// are answered once A's lease lapses, by the new owner; after SIGCONT A
// sends nothing to the kernel (its lease's epoch is behind, n counts
// each run once).
func TestReplicasForwardedRunsSurviveFrozenOwner(t *testing.T) {
	gs, dbURL := replicaCounts(t, "fwdfrozen")
	a, b := gs[0], gs[1]
	var cs contextState
	call(t, "GET", a.url+"api/contexts/counter", nil, 200, &cs)
	kernel := cs.KernelID
	epoch0, owner0 := leaseOf(t, dbURL, kernel)
	wait := inFlight(b.url, "counter", "import time; time.sleep(2); n += 1; n")
	waitBusyWithQueued(t, a, "counter", len(cs.ProcessIDs), 1)
	wait2 := inFlight(b.url, "counter", "n += 1; n")
	waitBusyWithQueued(t, a, "counter", len(cs.ProcessIDs), 2)
	a.cmd.Process.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { a.cmd.Process.Signal(syscall.SIGCONT) })
	// A read through C, sent while the frozen owner still holds the
	// lease, is not left waiting on it: the next owner answers.
	checkAnsweredElsewhere(t, gs[2], "counter", a)
	history := append(wait(), wait2()...)
	epoch1, owner1 := leaseOf(t, dbURL, kernel)
	if epoch1 <= epoch0 || owner1 == owner0 {
		t.Errorf("the lease after the owner froze: %s epoch %d, before %s epoch %d: want a new owner, a later epoch", owner1, epoch1, owner0, epoch0)
	}

	a.cmd.Process.Signal(syscall.SIGCONT)
	waitFor(t, func() bool { return strings.Contains(a.logs.String(), "kernel lease lost") },
		"the woken replica never said it lost the lease:\n%s", func() []any { return []any{a.logs} })
	history = append(history, postRun(a.url, "counter", "n += 1; n"))
	checkHistory(t, b, len(history), history)
	if epoch, owner := leaseOf(t, dbURL, kernel); owner != owner1 || epoch != epoch1 {
		t.Errorf("the lease after SIGCONT: %s epoch %d, want %s epoch %d still", owner, epoch, owner1, epoch1)
	}
	if t.Failed() {
		t.Logf("A:\n%s\nB:\n%s", a.logs, b.logs)
	}
}

// checkAnsweredElsewhere GETs the context through g at once and wants
// it answered (200) by a replica other than lost, within a minute.
func checkAnsweredElsewhere(t *testing.T, g *gatewayProcess, context string, lost *gatewayProcess) {
	t.Helper()
	client := &http.Client{Timeout: 60 * time.Second}
	resp, err := client.Get(g.url + "api/contexts/" + context)
	if err != nil {
		t.Errorf("GET the context through %s while its owner is lost: %v", g.url, err)
		return
	}
	defer resp.Body.Close()
	var cs contextState
	b, _ := io.ReadAll(resp.Body)
	json.Unmarshal(b, &cs)
	if resp.StatusCode != 200 || cs.Replica == "" || cs.Replica == replicaURL(lost) {
		t.Errorf("GET the context through %s while its owner is lost: %d %s, want 200 from the next owner", g.url, resp.StatusCode, b)
	}
}

// leaseOf reads a kernel's lease from the store.
func leaseOf(t *testing.T, dbURL, kernel string) (epoch int64, owner string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, `SELECT epoch, owner FROM leases WHERE kernel_id = $1`, kernel).Scan(&epoch, &owner); err != nil {
		t.Fatalf("the lease of kernel %s: %v", kernel, err)
	}
	return epoch, owner
}

// streamEvent is a run event with its start's run id.
type streamEvent struct {
	runEvent
	Run string `json:"run"`
}

// openStream POSTs a streamed run of code through url, as NDJSON or
// (sse) as server-sent events, and returns its events as they come
// (closed after its end, or when the stream ends). An SSE event's id
// must be its seq.
func openStream(t *testing.T, url, context, code string, sse bool) <-chan streamEvent {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"context": context, "code": code})
	req, _ := http.NewRequest("POST", url+"api/execute", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/x-ndjson")
	if sse {
		req.Header.Set("Accept", "text/event-stream")
	}
	resp, err := (&http.Client{Timeout: 120 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan streamEvent, 64)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		id := ""
		for sc.Scan() {
			line := sc.Bytes()
			if sse {
				if v, ok := bytes.CutPrefix(line, []byte("id: ")); ok {
					id = string(v)
				}
				data, ok := bytes.CutPrefix(line, []byte("data: "))
				if !ok {
					continue
				}
				line = data
			}
			var ev streamEvent
			if err := json.Unmarshal(line, &ev); err != nil {
				ev.Type = "not an event: " + string(line)
			}
			if sse && id != strconv.Itoa(ev.Seq) {
				ev.Type = "an SSE event whose id " + id + " is not its seq"
			}
			if ev.Type == "keepalive" {
				continue
			}
			out <- ev
			if ev.Type == "end" {
				return
			}
		}
	}()
	return out
}

// checkStream checks a run's events as a client got them: every event
// once, seqs 1, 2, 3… in order, stdout lines in order, ending completed.
func checkStream(t *testing.T, name string, evs []runEvent) {
	t.Helper()
	if len(evs) == 0 || evs[len(evs)-1].Type != "end" {
		t.Errorf("%s: the stream through B ended without its end event after its owner's death: %+v", name, evs)
		return
	}
	var out []string
	for i, ev := range evs {
		if ev.Seq != i+1 {
			t.Errorf("%s: event %d has seq %d: want every event once, in order: %+v", name, i+1, ev.Seq, evs)
			break
		}
		if ev.Type == "stdout" {
			out = append(out, strings.TrimSpace(ev.Text))
		}
	}
	for i := 1; i < len(out); i++ {
		a, _ := strconv.Atoi(out[i-1])
		b, _ := strconv.Atoi(out[i])
		if b <= a {
			t.Errorf("%s: stdout %q: a line twice or out of order", name, out)
			break
		}
	}
	if last := evs[len(evs)-1]; last.Process.Reason != "completed" {
		t.Errorf("%s: the run's end: %+v, want completed", name, last)
	}
}

// TestReplicasForwardedStreamSurvivesOwnerSIGKILL: two streamed runs sent
// through B to A (NDJSON, then SSE), the second queued behind the first
// and recorded by A,
// A SIGKILLed while the first prints: each client's one stream goes on
// from the new owner to its run's end, each event once, seqs in order;
// the second run is sent by the new owner, once.
func TestReplicasForwardedStreamSurvivesOwnerSIGKILL(t *testing.T) {
	gs, dbURL := replicaCounts(t, "fwdstream")
	a, b := gs[0], gs[1]
	first := openStream(t, b.url, "counter", "import time\nfor i in range(8):\n    print(i, flush=True)\n    time.sleep(0.5)\nn += 1\nn", false)
	var evs []runEvent
	for ev := range first {
		evs = append(evs, ev.runEvent)
		if ev.Type == "stdout" {
			break
		}
	}
	second := openStream(t, b.url, "counter", "print(100, flush=True); n += 10; n", true)
	start := <-second
	if start.Type != "start" || start.Run == "" {
		t.Fatalf("the queued run's first event: %+v, want its start", start)
	}
	// Its owner wrote its record (a queued run whose id left): the new
	// owner sends it from the store.
	waitFor(t, func() bool { return ownerRecorded(t, dbURL, start.Run) },
		"the queued run %s was never recorded by its owner", func() []any { return []any{start.Run} })
	killed := false
	for ev := range first {
		evs = append(evs, ev.runEvent)
		if ev.Type == "stdout" && strings.TrimSpace(ev.Text) == "1" && !killed {
			a.kill(t, syscall.SIGKILL)
			killed = true
		}
	}
	if !killed {
		t.Fatalf("the first run never printed 1: %+v", evs)
	}
	evs2 := []runEvent{start.runEvent}
	for ev := range second {
		evs2 = append(evs2, ev.runEvent)
	}
	checkStream(t, "the running run", evs)
	checkStream(t, "the queued run", evs2)
	if e := execute(t, b.url, "counter", "n"); e.text() != "11" {
		t.Errorf("n = %s after the streamed runs, want 11 (each run once)", e.text())
	}
	if t.Failed() {
		t.Logf("B:\n%s", b.logs)
	}
}

// ownerRecorded says whether a run's record in the store is its owner's
// (no longer the forwarding replica's "forwarded" one).
func ownerRecorded(t *testing.T, dbURL, run string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var forwarded *string
	if err := conn.QueryRow(ctx, `SELECT convert_from(data, 'UTF8')::json->>'forwarded' FROM runs WHERE id = $1`, run).Scan(&forwarded); err != nil {
		return false
	}
	return forwarded == nil
}

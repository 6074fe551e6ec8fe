//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
)

// replicaSecret is the cluster secret of the replicas of a test.
const replicaSecret = "a-cluster-secret-of-forty-bytes-01234567"

// startReplicas starts n gateways on one new database of srv, each a
// replica with runtime and state directories of its own, and waits
// until each sees them all live.
func startReplicas(t *testing.T, bin string, srv *pgtest.TB, db string, n int, args ...string) []*gatewayProcess {
	t.Helper()
	url := srv.CreateDB(db)
	secret := filepath.Join(t.TempDir(), "cluster-secret")
	if err := os.WriteFile(secret, []byte(replicaSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var gs []*gatewayProcess
	for range n {
		dirs := newRestartDirs(t)
		gs = append(gs, startGateway(t, bin, append([]string{"--state-url", url, "--cluster-secret-file", secret,
			"--runtime-dir", dirs.runtime, "--pool-size", "0"}, args...)...))
	}
	waitReplicasLive(t, gs)
	// Run before each gateway's own stop (cleanups run last first): the
	// replicas stop one after the other, each handing its kernels over to
	// those still serving, the last one shutting them down; then no
	// process any of them started is left.
	t.Cleanup(func() { stopReplicas(t, gs) })
	return gs
}

// stopReplicas stops with SIGTERM, one after the other, the replicas of
// gs still running, and checks that every process below any of them
// when it began is gone once the last one exited: kernels a replica
// handed over while others served are stopped by the last one standing.
func stopReplicas(t *testing.T, gs []*gatewayProcess) {
	t.Helper()
	var kids []int
	for _, g := range gs {
		if g.cmd.ProcessState == nil {
			kids = append(kids, descendants(g.cmd.Process.Pid)...)
		}
	}
	for _, g := range gs {
		if g.cmd.ProcessState != nil {
			continue
		}
		g.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-g.done:
			if err != nil {
				t.Errorf("kernelgate exit: %v\n%s", err, g.logs)
			}
		case <-time.After(60 * time.Second):
			g.cmd.Process.Kill()
			t.Errorf("kernelgate did not exit after SIGTERM\n%s", g.logs)
		}
	}
	// A kernel's orphan watchdog whose kernel ended under another
	// replica than the one that started it ends at its next check.
	alive := func(pid int) (string, bool) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return string(b), err == nil && syscall.Kill(pid, 0) == nil && !strings.Contains(string(b), ") Z ")
	}
	pollUntil(15*time.Second, func() bool {
		return !slices.ContainsFunc(kids, func(pid int) bool { _, ok := alive(pid); return ok })
	})
	for _, pid := range kids {
		if b, ok := alive(pid); ok {
			t.Errorf("process %d outlived the replicas: %s", pid, b)
		}
	}
}

// waitReplicasLive waits until each of gs sees them all live.
func waitReplicasLive(t *testing.T, gs []*gatewayProcess) {
	t.Helper()
	for _, g := range gs {
		var st replicaStatus
		waitFor(t, func() bool {
			call(t, "GET", g.url+"api/status", nil, 200, &st)
			for _, o := range gs {
				if !slices.Contains(st.Replicas, replicaURL(o)) {
					return false
				}
			}
			return st.Replica == replicaURL(g)
		}, "%s: status %+v, want every replica live", func() []any { return []any{g.url, st} })
	}
}

// replicaStatus is GET /api/status's part about replicas.
type replicaStatus struct {
	Replica  string   `json:"replica"`
	Replicas []string `json:"replicas"`
}

// replicaURL is the URL a replica of a test advertises: its address.
func replicaURL(g *gatewayProcess) string { return strings.TrimSuffix(g.url, "/") }

// TestReplicasServeOneSetOfKernels: three replicas with local kernels on
// one database. A context created through A is A's; code run through B
// and C runs on its one kernel (its state is shared), its kernel's
// websocket works through C, and a streamed run started through B is
// resumed through C; each says A owns the context.
func TestReplicasServeOneSetOfKernels(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	gs := startReplicas(t, bin, srv, "replicas", 3)
	a, b, c := gs[0], gs[1], gs[2]

	var cm struct {
		KernelID string `json:"kernelId"`
		Replica  string `json:"replica"`
	}
	call(t, "POST", a.url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, nil)
	var e execution
	call(t, "POST", b.url+"api/execute", map[string]any{"context": "agent", "code": "x = 41"}, 200, &e)
	if e.Process.Reason != "completed" {
		t.Fatalf("x = 41 through B: %+v", e)
	}
	call(t, "POST", c.url+"api/execute", map[string]any{"context": "agent", "code": "x + 1"}, 200, &e)
	if e.text() != "42" {
		t.Fatalf("x + 1 through C: %+v, want 42", e)
	}
	for _, g := range gs {
		call(t, "GET", g.url+"api/contexts/agent", nil, 200, &cm)
		if cm.Replica != replicaURL(a) {
			t.Errorf("the context through %s: replica %q, want its owner %s", g.url, cm.Replica, replicaURL(a))
		}
	}
	if got := wsExecute(t, c.url, cm.KernelID, "x * 2"); got != "82" {
		t.Errorf("x * 2 through C's websocket to the kernel: %q, want 82", got)
	}

	run := streamRun(t, b.url, "agent", "import time\nfor i in range(4):\n    print(i, flush=True)\n    time.sleep(0.2)", 1)
	evs := runEvents(t, c.url, run, 2) // after its start and first line
	var out []string
	for _, ev := range evs {
		if ev.Type == "stdout" {
			out = append(out, strings.TrimSpace(ev.Text))
		}
	}
	if last := evs[len(evs)-1]; last.Process.Reason != "completed" || !slices.Equal(out, []string{"1", "2", "3"}) {
		t.Errorf("the run started through B, resumed through C after its first line: stdout %q, end %+v; want 1 2 3, completed", out, last)
	}
}

// TestReplicasNeedClusterSecret: a gateway on a database is a replica,
// which refuses to start without the cluster secret the replicas sign
// their forwarded requests with, saying so, and without the URL's
// password in what it says.
func TestReplicasNeedClusterSecret(t *testing.T) {
	bin := buildBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "serve", "--port", "0", "--state-url", "postgres://kg:pw-in-url@127.0.0.1:1/kg",
		"--runtime-dir", t.TempDir(), "--pool-size", "0")
	cmd.Env = append(os.Environ(), "XDG_STATE_HOME="+t.TempDir(), "KERNELGATE_CLUSTER_SECRET=", "KERNELGATE_CLUSTER_SECRET_FILE=")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "cluster secret") {
		t.Errorf("a replica without a cluster secret: %v, want a refusal naming it:\n%s", err, out)
	}
	if strings.Contains(string(out), "pw-in-url") {
		t.Errorf("the refusal shows the database password:\n%s", out)
	}
}

// ownerOf returns the replica of gs that owns the context, as the
// context's model says through any of them.
func ownerOf(t *testing.T, gs []*gatewayProcess, context string) (owner *gatewayProcess, others []*gatewayProcess) {
	t.Helper()
	var cm struct{ Replica string }
	call(t, "GET", gs[0].url+"api/contexts/"+context, nil, 200, &cm)
	for _, g := range gs {
		if replicaURL(g) == cm.Replica {
			owner = g
		} else {
			others = append(others, g)
		}
	}
	if owner == nil {
		t.Fatalf("context %s: owner %q is none of the replicas", context, cm.Replica)
	}
	return owner, others
}

// TestReplicasFailoverAfterSIGKILL: when the replica owning a context is
// SIGKILLed, a survivor takes its kernel over (the same process) within
// the lease and a few seconds: the context answers through either
// survivor with its state kept.
func TestReplicasFailoverAfterSIGKILL(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	gs := startReplicas(t, bin, srv, "failover", 3, "--lease", "2s")
	call(t, "POST", gs[0].url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, nil)
	var e execution
	call(t, "POST", gs[1].url+"api/execute", map[string]any{"context": "agent", "code": "x = 41"}, 200, &e)
	owner, survivors := ownerOf(t, gs, "agent")
	owner.kill(t, syscall.SIGKILL)

	// Within the lease and a few seconds a survivor owns the context.
	var cm struct{ Replica string }
	if !pollUntil(15*time.Second, func() bool {
		cm.Replica = ""
		_, err := tryCall(survivors[0].url+"api/contexts/agent", &cm)
		return err == nil && (cm.Replica == replicaURL(survivors[0]) || cm.Replica == replicaURL(survivors[1]))
	}) {
		t.Fatalf("no survivor took the context over within 15 s of its owner's death: %+v\n%s\n%s", cm, survivors[0].logs, survivors[1].logs)
	}
	for _, g := range survivors {
		call(t, "POST", g.url+"api/execute", map[string]any{"context": "agent", "code": "x + 1"}, 200, &e)
		if e.text() != "42" {
			t.Errorf("x + 1 through %s after the owner's death: %+v, want 42 (its state kept)", g.url, e)
		}
	}
}

// tryCall GETs url and decodes a 200's body into out; an error for any
// other answer (a replica forwarding to a dead owner answers 503), or
// none within 5 s (one forwarding to a frozen owner waits for it).
func tryCall(url string, out any) (int, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return resp.StatusCode, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return 200, json.NewDecoder(resp.Body).Decode(out)
}

// TestReplicasFrozenOwnerLetsGo: a replica SIGSTOPped past its lease
// loses its kernel to a survivor, which takes it over with its state;
// after SIGCONT the frozen one does not act for it again: it lets the
// kernel go (its late lease lost, its writes refused), answers for the
// context by forwarding to the new owner, and the context has one state.
func TestReplicasFrozenOwnerLetsGo(t *testing.T) {
	bin := buildBinary(t)
	srv := pgtest.Start(t)
	gs := startReplicas(t, bin, srv, "frozen", 3, "--lease", "2s")
	call(t, "POST", gs[0].url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, nil)
	var e execution
	call(t, "POST", gs[1].url+"api/execute", map[string]any{"context": "agent", "code": "x = 41"}, 200, &e)
	frozen, survivors := ownerOf(t, gs, "agent")
	frozen.cmd.Process.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { frozen.cmd.Process.Signal(syscall.SIGCONT) })

	var cm struct{ Replica string }
	if !pollUntil(15*time.Second, func() bool {
		cm.Replica = ""
		_, err := tryCall(survivors[0].url+"api/contexts/agent", &cm)
		return err == nil && cm.Replica != "" && cm.Replica != replicaURL(frozen)
	}) {
		t.Fatalf("no survivor took the context over within 15 s of its owner freezing: %+v", cm)
	}
	newOwner := cm.Replica
	call(t, "POST", survivors[1].url+"api/execute", map[string]any{"context": "agent", "code": "x += 1; x"}, 200, &e)
	if e.text() != "42" {
		t.Fatalf("x += 1 through a survivor while the owner is frozen: %+v, want 42", e)
	}

	frozen.cmd.Process.Signal(syscall.SIGCONT)
	// The woken replica lets the kernel go and forwards to the new owner.
	waitFor(t, func() bool {
		cm.Replica = ""
		_, err := tryCall(frozen.url+"api/contexts/agent", &cm)
		return err == nil && cm.Replica == newOwner
	}, "the woken replica says the context is %q's, want %s's", func() []any { return []any{cm.Replica, newOwner} })
	// Its listing (the cluster's) shows the kernel as the new owner's:
	// were it still its own, its own model would come first.
	var agent struct {
		KernelID string `json:"kernelId"`
	}
	call(t, "GET", frozen.url+"api/contexts/agent", nil, 200, &agent)
	if k := listing(t, frozen.url, "api/kernels")[agent.KernelID]; k.Replica != newOwner {
		t.Errorf("the woken replica lists the context's kernel as %+v, want it %s's", k, newOwner)
	}
	if !strings.Contains(frozen.logs.String(), "kernel lease lost") {
		t.Errorf("the woken replica's log does not say it lost the lease:\n%s", frozen.logs)
	}
	call(t, "POST", frozen.url+"api/execute", map[string]any{"context": "agent", "code": "x += 1; x"}, 200, &e)
	if e.text() != "43" {
		t.Errorf("x += 1 through the woken replica: %+v, want 43 (one state, the new owner's)", e)
	}
}

//go:build linux

package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
	"kernelgate/state"
)

// replicaProc is a replica process (replicaMain) and what it said.
type replicaProc struct {
	t      *testing.T
	id     string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer
	read   chan struct{} // closed when its stdout has ended

	mu    sync.Mutex
	lines []string // not yet awaited
}

// startReplica starts a replica process of id on the database at url;
// the test's end kills it if it still runs.
func startReplica(t *testing.T, url, id string) *replicaProc {
	t.Helper()
	r := &replicaProc{t: t, id: id, read: make(chan struct{})}
	r.cmd = exec.Command(os.Args[0], "-test.run=^$")
	r.cmd.Env = append(os.Environ(), replicaEnv+"="+id, replicaURLEnv+"="+url, replicaLeaseEnv+"="+testLease.String())
	r.cmd.Stderr = &r.stderr
	var err error
	if r.stdin, err = r.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(r.read)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			r.mu.Lock()
			r.lines = append(r.lines, sc.Text())
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		r.cmd.Process.Kill()
		<-r.read
		r.cmd.Wait()
	})
	r.await("ready " + id)
	return r
}

// send writes a command line.
func (r *replicaProc) send(format string, args ...any) {
	r.t.Helper()
	if _, err := fmt.Fprintf(r.stdin, format+"\n", args...); err != nil {
		r.t.Fatalf("replica %s: %v", r.id, err)
	}
}

// await returns the first line said and not yet awaited that starts
// with one of prefixes, waiting for it for at most 30 s.
func (r *replicaProc) await(prefixes ...string) string {
	r.t.Helper()
	prefix := strings.Join(prefixes, `" or "`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ended := false // stdout ended before the lines were looked at
		select {
		case <-r.read:
			ended = true
		default:
		}
		r.mu.Lock()
		for i, l := range r.lines {
			if slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(l, p) }) {
				r.lines = slices.Delete(r.lines, i, i+1)
				r.mu.Unlock()
				return l
			}
		}
		said := slices.Clone(r.lines)
		r.mu.Unlock()
		if ended {
			r.cmd.Wait() // its stderr is all copied
			r.t.Fatalf("replica %s ended without saying %q; it said %q; stderr:\n%s", r.id, prefix, said, r.stderr.String())
		}
		select {
		case <-r.read:
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("replica %s did not say %q within 30s; it said %q", r.id, prefix, said)
		}
	}
}

func (r *replicaProc) signal(sig syscall.Signal) {
	r.t.Helper()
	if err := r.cmd.Process.Signal(sig); err != nil {
		r.t.Fatalf("replica %s: %v: %v", r.id, sig, err)
	}
}

// testReplica opens the store of a replica in this process, and joins.
func testReplica(t *testing.T, url, id string) (*state.Postgres, *Member) {
	t.Helper()
	s, err := state.OpenPostgres(context.Background(), url, state.PostgresOptions{Replica: id})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	m, err := Join(context.Background(), s, Config{URL: "http://" + id + ".test", Lease: testLease})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(context.Background()) })
	return s, m
}

// waitLive waits until m sees exactly the replicas ids live.
func waitLive(t *testing.T, m *Member, ids ...string) {
	t.Helper()
	var got []string
	waitFor(t, func() bool {
		got = got[:0]
		for _, r := range m.Live() {
			got = append(got, r.ID)
		}
		return slices.Equal(got, ids)
	}, func() string { return fmt.Sprintf("live replicas %v, want %v", got, ids) })
}

// TestMembersLiveSet: replicas in other processes see each other; one
// killed (SIGKILL) or frozen (SIGSTOP) leaves the live set within the
// lease, a frozen one comes back after SIGCONT, and one stopped cleanly
// removes its row.
func TestMembersLiveSet(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("members")
	store, me := testReplica(t, url, "t")
	a := startReplica(t, url, "a")
	b := startReplica(t, url, "b")
	c := startReplica(t, url, "c")
	waitLive(t, me, "a", "b", "c", "t")
	for _, r := range me.Live() {
		if r.ID == "a" && r.URL != "http://a.test" {
			t.Errorf("a advertises %q, want http://a.test", r.URL)
		}
	}

	b.signal(syscall.SIGKILL)
	waitLive(t, me, "a", "c", "t")
	c.signal(syscall.SIGSTOP)
	waitLive(t, me, "a", "t")
	c.signal(syscall.SIGCONT)
	waitLive(t, me, "a", "c", "t")

	a.send("quit")
	a.await("bye")
	rows, err := store.LiveReplicas(context.Background(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	// a left cleanly: no row; b was killed: its row stays, not live.
	if want := []string{"b", "c", "t"}; !slices.Equal(ids, want) {
		t.Errorf("rows heard from within an hour: %v, want %v", ids, want)
	}
}

// TestLeaseLostToSIGSTOP: a replica frozen past the lease loses its
// kernel to another, which takes it under the next epoch and writes; once
// thawed, the frozen one's keeper reports the loss, and its write under
// the old epoch is refused (ErrFenced) while the new owner's stays.
func TestLeaseLostToSIGSTOP(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("sigstop")
	ctx := context.Background()
	a := startReplica(t, url, "a")
	a.send("acquire k1")
	if got := a.await("acquired k1"); got != "acquired k1 1" {
		t.Fatalf("a: %q, want epoch 1", got)
	}
	a.send("write k1 1 a-before")
	a.await("wrote k1 1")

	store, _ := testReplica(t, url, "t")
	keeper, err := NewKeeper(store, Config{Lease: testLease}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer keeper.Close()
	if l, err := keeper.Acquire(ctx, "k1"); !errors.Is(err, state.ErrLeaseHeld) || l.Owner != "a" || l.OwnerURL != "http://a.test" {
		t.Fatalf("acquire of a's live lease: %+v, %v; want ErrLeaseHeld naming a", l, err)
	}

	a.signal(syscall.SIGSTOP)
	var l state.Lease
	waitFor(t, func() bool {
		l, err = keeper.Acquire(ctx, "k1")
		return err == nil
	}, func() string { return fmt.Sprintf("taking k1 from the frozen replica: %v", err) })
	if l.Epoch != 2 || l.Owner != "t" {
		t.Fatalf("k1 taken as %+v, want epoch 2 owned by t", l)
	}
	f, ok := keeper.Fence("k1")
	if !ok || f != l.Fence() {
		t.Fatalf("keeper's fence %v %v, want %v", f, ok, l.Fence())
	}
	if err := state.Fenced(store, f).PutKernel(ctx, state.Kernel{ID: "k1", Spec: "t-after"}); err != nil {
		t.Fatalf("the new owner's write: %v", err)
	}

	a.signal(syscall.SIGCONT)
	a.await("lost k1 1")
	a.send("write k1 1 a-late")
	if got := a.await("fenced k1"); got != "fenced k1 1" {
		t.Errorf("a's late write: %q", got)
	}
	snap, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Kernels) != 1 || snap.Kernels[0].Spec != "t-after" {
		t.Errorf("kernels %+v, want k1 as the new owner wrote it", snap.Kernels)
	}
	own, err := store.LeaseOwner(ctx, "k1")
	if err != nil || own.Owner != "t" || own.Epoch != 2 {
		t.Errorf("owner of k1: %+v, %v; want t at epoch 2", own, err)
	}
}

// TestAcquireRaceProcesses: two replica processes acquire the same free
// kernels at once: each kernel is won by exactly one, which the store
// names as its owner.
func TestAcquireRaceProcesses(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("race")
	a := startReplica(t, url, "a")
	b := startReplica(t, url, "b")
	var kernels []string
	for i := range 20 {
		kernels = append(kernels, "k"+strconv.Itoa(i))
	}
	cmd := "acquire " + strings.Join(kernels, " ")
	a.send("%s", cmd)
	b.send("%s", cmd)
	store, err := state.OpenPostgres(context.Background(), url, state.PostgresOptions{Replica: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for _, k := range kernels {
		var winners []string
		for _, r := range []*replicaProc{a, b} {
			if strings.HasPrefix(r.await("acquired "+k+" ", "held "+k+" "), "acquired") {
				winners = append(winners, r.id)
			}
		}
		if len(winners) != 1 {
			t.Errorf("%s won by %v, want exactly one replica", k, winners)
			continue
		}
		own, err := store.LeaseOwner(context.Background(), k)
		if err != nil || own.Owner != winners[0] || own.Epoch != 1 {
			t.Errorf("owner of %s: %+v, %v; want %s at epoch 1", k, own, err, winners[0])
		}
	}
}

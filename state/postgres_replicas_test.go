package state

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
)

// TestPostgresReplicasShareDatabase: replicas open one database together,
// while the database's one gateway is refused; and a replica is refused
// while a one-gateway store holds it.
func TestPostgresReplicasShareDatabase(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("share")
	ctx := context.Background()
	a := openPG(t, url, PostgresOptions{Replica: "a"})
	b := openPG(t, url, PostgresOptions{Replica: "b"})
	must(t, a.PutKernel(ctx, sampleKernel("k1")))
	if _, err := OpenPostgres(ctx, url, PostgresOptions{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("one gateway on a database replicas use: %v, want ErrLocked", err)
	}
	snap, err := b.Load(ctx)
	must(t, err)
	if len(snap.Kernels) != 1 {
		t.Errorf("replica b finds %d kernels, want the 1 replica a wrote", len(snap.Kernels))
	}
	must(t, a.Close())
	must(t, b.Close())
	one := openPG(t, url, PostgresOptions{})
	defer one.Close()
	_, err = OpenPostgres(ctx, url, PostgresOptions{Replica: "c"})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "one gateway") {
		t.Fatalf("a replica on a database its one gateway holds: %v, want ErrLocked saying why", err)
	}
	if _, err := one.AcquireLease(ctx, "k1", time.Second); !errors.Is(err, ErrNotReplica) {
		t.Errorf("a lease taken by the one gateway: %v, want ErrNotReplica", err)
	}
}

// TestPostgresLeases: acquire, held by another, renew, release, transfer
// and the owner as another replica sees it, with epochs that only grow.
func TestPostgresLeases(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("leases")
	ctx := context.Background()
	a := openPG(t, url, PostgresOptions{Replica: "a"})
	defer a.Close()
	b := openPG(t, url, PostgresOptions{Replica: "b"})
	defer b.Close()
	must(t, a.JoinReplicas(ctx, "http://a:8888"))
	must(t, b.JoinReplicas(ctx, "http://b:8888"))
	const ttl = time.Minute

	la, err := a.AcquireLease(ctx, "k1", ttl)
	must(t, err)
	if la.Epoch != 1 || la.Owner != "a" || la.OwnerURL != "http://a:8888" {
		t.Errorf("first lease: %+v, want epoch 1 owned by a at http://a:8888", la)
	}
	held, err := b.AcquireLease(ctx, "k1", ttl)
	if !errors.Is(err, ErrLeaseHeld) || held.Owner != "a" || held.Epoch != 1 {
		t.Fatalf("b acquires a's lease: %+v, %v; want ErrLeaseHeld naming a, epoch 1", held, err)
	}
	own, err := b.LeaseOwner(ctx, "k1")
	must(t, err)
	if own.Owner != "a" || own.OwnerURL != "http://a:8888" || own.Epoch != 1 {
		t.Errorf("owner as b sees it: %+v", own)
	}
	if _, err := b.LeaseOwner(ctx, "nobody"); !errors.Is(err, ErrNoLease) {
		t.Errorf("owner of a kernel never leased: %v, want ErrNoLease", err)
	}

	// Renew: only what is still held comes back.
	lk2, err := a.AcquireLease(ctx, "k2", ttl)
	must(t, err)
	still, err := a.RenewLeases(ctx, []Fence{la.Fence(), lk2.Fence(), {"k2", 99}, {"k3", 1}}, ttl)
	must(t, err)
	slices.SortFunc(still, func(x, y Fence) int { return strings.Compare(x.Kernel, y.Kernel) })
	if want := []Fence{{"k1", 1}, {"k2", 1}}; !slices.Equal(still, want) {
		t.Errorf("renewed %v, want %v", still, want)
	}
	if still, err := b.RenewLeases(ctx, []Fence{la.Fence()}, ttl); err != nil || len(still) != 0 {
		t.Errorf("b renews a's lease: %v, %v; want none renewed", still, err)
	}

	// Release: free for b, under the next epoch; a's renew loses it.
	must(t, a.ReleaseLease(ctx, la.Fence()))
	if _, err := a.LeaseOwner(ctx, "k1"); !errors.Is(err, ErrNoLease) {
		t.Errorf("owner of a released lease: %v, want ErrNoLease", err)
	}
	lb, err := b.AcquireLease(ctx, "k1", ttl)
	must(t, err)
	if lb.Epoch != 2 || lb.Owner != "b" {
		t.Errorf("b's lease after a released it: %+v, want epoch 2", lb)
	}
	if still, err := a.RenewLeases(ctx, []Fence{la.Fence()}, ttl); err != nil || len(still) != 0 {
		t.Errorf("a renews the lease it released: %v, %v", still, err)
	}

	// Transfer: b hands k1 to a under epoch 3; its own fence is stale.
	if _, err := b.TransferLease(ctx, lb.Fence(), "nobody", ttl); !errors.Is(err, ErrNoReplica) {
		t.Errorf("transfer to a replica that is not there: %v, want ErrNoReplica", err)
	}
	lt, err := b.TransferLease(ctx, lb.Fence(), "a", ttl)
	must(t, err)
	if lt.Epoch != 3 || lt.Owner != "a" || lt.OwnerURL != "http://a:8888" {
		t.Errorf("transferred lease: %+v, want epoch 3 owned by a", lt)
	}
	if _, err := b.TransferLease(ctx, lb.Fence(), "a", ttl); !errors.Is(err, ErrFenced) {
		t.Errorf("transfer of a lease no longer held: %v, want ErrFenced", err)
	}
	if err := Fenced(b, lb.Fence()).PutKernel(ctx, sampleKernel("k1")); !errors.Is(err, ErrFenced) {
		t.Errorf("b writes under the lease it handed over: %v, want ErrFenced", err)
	}
	must(t, Fenced(a, lt.Fence()).PutKernel(ctx, sampleKernel("k1")))

	// A lapsed lease is lost to its holder and free for another.
	short, err := a.AcquireLease(ctx, "k4", 50*time.Millisecond)
	must(t, err)
	var taken Lease
	waitUntil(t, func() bool {
		taken, err = b.AcquireLease(ctx, "k4", ttl)
		return err == nil
	}, "b to take a's lapsed lease")
	if taken.Epoch != short.Epoch+1 {
		t.Errorf("epoch after a lapse: %d, want %d", taken.Epoch, short.Epoch+1)
	}
	if err := Fenced(a, short.Fence()).PutKernel(ctx, sampleKernel("k4")); !errors.Is(err, ErrFenced) {
		t.Errorf("a writes under its lapsed lease: %v, want ErrFenced", err)
	}
}

// TestPostgresMembers: replicas' rows, the live set and a clean leave.
func TestPostgresMembers(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("members")
	ctx := context.Background()
	a := openPG(t, url, PostgresOptions{Replica: "a"})
	defer a.Close()
	b := openPG(t, url, PostgresOptions{Replica: "b"})
	defer b.Close()
	must(t, a.JoinReplicas(ctx, "http://a"))
	must(t, b.JoinReplicas(ctx, "http://b"))
	live, err := a.Heartbeat(ctx, "http://a", time.Minute)
	must(t, err)
	if len(live) != 2 || live[0].ID != "a" || live[0].URL != "http://a" || live[1].ID != "b" || live[0].Started.IsZero() {
		t.Errorf("live: %+v, want a and b", live)
	}
	must(t, b.LeaveReplicas(ctx))
	live, err = a.LiveReplicas(ctx, time.Minute)
	must(t, err)
	if len(live) != 1 || live[0].ID != "a" {
		t.Errorf("live after b left: %+v, want a", live)
	}
	// Heard from too long ago: not live.
	waitUntil(t, func() bool {
		live, err = a.LiveReplicas(ctx, 20*time.Millisecond)
		return err == nil && len(live) == 0
	}, "a to be unheard for 20ms")
}

// TestPostgresFencedCommit: in one commit, the writes under a fence not
// held are refused with ErrFenced (durable ones told so, queued run
// writes dropped) and the others, under a fence held or none, go in.
func TestPostgresFencedCommit(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("fenced")
	ctx := context.Background()
	var hold sync.Mutex // held: the writer waits before its next commit
	a := openPG(t, url, PostgresOptions{Replica: "a", Options: Options{BeforeCommit: func(int) { hold.Lock(); hold.Unlock() }}})
	defer a.Close()
	b := openPG(t, url, PostgresOptions{Replica: "b"})
	defer b.Close()
	const ttl = time.Minute
	mine, err := a.AcquireLease(ctx, "mine", ttl)
	must(t, err)
	lost, err := a.AcquireLease(ctx, "lost", ttl)
	must(t, err)
	must(t, a.ReleaseLease(ctx, lost.Fence()))
	taken, err := b.AcquireLease(ctx, "lost", ttl)
	must(t, err)
	must(t, Fenced(b, taken.Fence()).PutKernel(ctx, Kernel{ID: "lost", Spec: "b's"}))

	hold.Lock()
	// Something for the writer to wait on before the batch under test.
	must(t, a.PutRun("first", []byte("1")))
	waitUntil(t, func() bool { return queued(&a.writeQueue) == 0 }, "the writer to take the first write")
	stale, held := Fenced(a, lost.Fence()), Fenced(a, mine.Fence())
	must(t, stale.PutRun("stale-run", []byte("x")))
	must(t, stale.AppendRunEvents("stale-run", Event{1, []byte("e")}))
	must(t, held.PutRun("held-run", []byte("y")))
	must(t, a.PutRun("plain-run", []byte("z")))
	errs := make(chan error, 4)
	go func() { errs <- stale.PutKernel(ctx, Kernel{ID: "lost", Spec: "a's"}) }()
	go func() { errs <- held.PutKernel(ctx, Kernel{ID: "mine", Spec: "a's"}) }()
	go func() { errs <- a.PutSession(ctx, Session{ID: "s1", KernelID: "mine", Created: t0}) }()
	must(t, stale.CommitRunAsync("stale-async", []byte("w"), func(err error) { errs <- err }))
	waitUntil(t, func() bool { return queued(&a.writeQueue) == 8 }, "eight writes queued")
	hold.Unlock()
	var fenced, ok int
	for range 4 {
		switch err := <-errs; {
		case err == nil:
			ok++
		case errors.Is(err, ErrFenced):
			fenced++
		default:
			t.Errorf("a write: %v", err)
		}
	}
	if fenced != 2 || ok != 2 {
		t.Errorf("%d writes refused, %d accepted; want the 2 under the lost lease refused", fenced, ok)
	}
	snap, err := b.Load(ctx)
	must(t, err)
	kernels := map[string]string{}
	for _, k := range snap.Kernels {
		kernels[k.ID] = k.Spec
	}
	if kernels["lost"] != "b's" || kernels["mine"] != "a's" {
		t.Errorf("kernels %v: want lost written by b only, mine by a", kernels)
	}
	var runs []string
	for _, r := range snap.Runs {
		runs = append(runs, r.ID)
	}
	if want := []string{"first", "held-run", "plain-run"}; !slices.Equal(runs, want) {
		t.Errorf("runs %v, want %v", runs, want)
	}
	if len(snap.Sessions) != 1 {
		t.Errorf("sessions %v, want the one written under no fence", snap.Sessions)
	}
}

// TestPostgresAcquireRace: replicas acquiring the same free leases at
// once: exactly one wins each, and the others are told who.
func TestPostgresAcquireRace(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("race")
	ctx := context.Background()
	var stores []*Postgres
	for i := range 3 {
		s := openPG(t, url, PostgresOptions{Replica: fmt.Sprintf("r%d", i)})
		defer s.Close()
		stores = append(stores, s)
	}
	const kernels = 30
	type result struct {
		kernel, replica string
		lease           Lease
		err             error
	}
	results := make(chan result, kernels*len(stores))
	var wg sync.WaitGroup
	for k := range kernels {
		for _, s := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := s.AcquireLease(ctx, fmt.Sprintf("k%02d", k), time.Minute)
				results <- result{fmt.Sprintf("k%02d", k), s.Replica(), l, err}
			}()
		}
	}
	wg.Wait()
	close(results)
	winners := map[string][]string{}
	for r := range results {
		switch {
		case r.err == nil:
			winners[r.kernel] = append(winners[r.kernel], r.replica)
		case !errors.Is(r.err, ErrLeaseHeld):
			t.Errorf("%s by %s: %v", r.kernel, r.replica, r.err)
		}
	}
	for k := range kernels {
		id := fmt.Sprintf("k%02d", k)
		if len(winners[id]) != 1 {
			t.Errorf("%s won by %v, want exactly one replica", id, winners[id])
		}
	}
}

// queued is how many writes wait for q's writer.
func queued(q *writeQueue) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}

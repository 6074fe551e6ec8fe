package state

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
)

// TestPostgresClaimContext: of replicas claiming one context at once,
// one wins and the others are told the winner; a claim whose kernel's
// lease lapsed is taken by the next claimer; a claim under a lease not
// held is refused.
func TestPostgresClaimContext(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("claims")
	ctx := context.Background()
	const n = 4
	var stores []*Postgres
	for i := range n {
		p := openPG(t, url, PostgresOptions{Replica: string(rune('a' + i))})
		defer p.Close()
		must(t, p.JoinReplicas(ctx, "http://"+p.Replica()+":8888"))
		stores = append(stores, p)
	}
	leases := make([]Lease, n)
	for i, p := range stores {
		var err error
		leases[i], err = p.AcquireLease(ctx, "kernel-"+p.Replica(), time.Minute)
		must(t, err)
	}
	errs := make([]error, n)
	held := make([]Lease, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, p := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			rec := Context{ID: "code-python", Language: "python", KernelID: leases[i].Kernel, Created: time.Now()}
			held[i], errs[i] = p.ClaimContext(ctx, rec, leases[i].Fence())
		}()
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner < 0:
			winner = i
		case err == nil:
			t.Fatalf("replicas %d and %d both won the claim", winner, i)
		case !errors.Is(err, ErrLeaseHeld):
			t.Fatalf("replica %d: %v, want a win or ErrLeaseHeld", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no replica won the claim")
	}
	for i, err := range errs {
		if err != nil && (held[i].Kernel != leases[winner].Kernel || held[i].OwnerURL != "http://"+stores[winner].Replica()+":8888") {
			t.Errorf("replica %d lost to %+v, want the winner's lease %+v", i, held[i], leases[winner])
		}
	}
	if l, err := stores[0].OwnerOf(ctx, OfContext, "code-python"); err != nil || l.Owner != stores[winner].Replica() {
		t.Errorf("the claimed context's owner: %+v, %v; want the winner", l, err)
	}

	// The winner's lease released: the next claim takes the context.
	must(t, stores[winner].ReleaseLease(ctx, leases[winner].Fence()))
	other := (winner + 1) % n
	rec := Context{ID: "code-python", Language: "python", KernelID: leases[other].Kernel, Created: time.Now()}
	if _, err := stores[other].ClaimContext(ctx, rec, leases[other].Fence()); err != nil {
		t.Errorf("a claim of a context whose kernel no replica holds: %v", err)
	}
	// A claim under a fence not held writes nothing.
	stale := Fence{Kernel: leases[winner].Kernel, Epoch: leases[winner].Epoch}
	rec = Context{ID: "another", Language: "python", KernelID: stale.Kernel}
	if _, err := stores[winner].ClaimContext(ctx, rec, stale); !errors.Is(err, ErrFenced) {
		t.Errorf("a claim under a released lease: %v, want ErrFenced", err)
	}
}

// TestPostgresListingAndTokens: the listing gives each record with the
// owner of its kernel, and a context is found by the hash of a token it
// keeps.
func TestPostgresListingAndTokens(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("listing")
	ctx := context.Background()
	a := openPG(t, url, PostgresOptions{Replica: "a"})
	defer a.Close()
	b := openPG(t, url, PostgresOptions{Replica: "b"})
	defer b.Close()
	must(t, a.JoinReplicas(ctx, "http://a:8888"))
	la, err := a.AcquireLease(ctx, "k1", time.Minute)
	must(t, err)
	w := Fenced(a, la.Fence())
	must(t, w.PutKernel(ctx, sampleKernel("k1")))
	hash := sha256.Sum256([]byte("kgc_token"))
	must(t, w.PutContext(ctx, Context{ID: "c1", Language: "python", KernelID: "k1", Tokens: []TokenHash{{Hash: hash, Expires: time.Now().Add(time.Hour)}}}))
	must(t, w.PutSession(ctx, Session{ID: "s1", Path: "a.ipynb", KernelID: "k1"}))
	must(t, b.PutContext(ctx, Context{ID: "no-kernel", Language: "python"}))

	l, err := b.Listing(ctx)
	must(t, err)
	if len(l.Kernels) != 1 || l.Kernels[0].Rec.ID != "k1" || l.Kernels[0].OwnerURL != "http://a:8888" {
		t.Errorf("kernels: %+v, want k1 owned by a", l.Kernels)
	}
	owners := map[string]string{}
	for _, c := range l.Contexts {
		owners[c.Rec.ID] = c.OwnerURL
	}
	if len(owners) != 2 || owners["c1"] != "http://a:8888" || owners["no-kernel"] != "" {
		t.Errorf("contexts' owners: %v, want c1 a's and no-kernel nobody's", owners)
	}
	if len(l.Sessions) != 1 || l.Sessions[0].Owner != "a" {
		t.Errorf("sessions: %+v, want s1 owned by a", l.Sessions)
	}

	c, err := b.ContextByToken(ctx, hash)
	if err != nil || c.ID != "c1" {
		t.Errorf("the context of the token: %+v, %v; want c1", c, err)
	}
	if _, err := b.ContextByToken(ctx, sha256.Sum256([]byte("kgc_other"))); !errors.Is(err, ErrNoToken) {
		t.Errorf("an unknown token: %v, want ErrNoToken", err)
	}
}

package state

import (
	"context"
	"errors"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
)

// TestPostgresLeavingReplicaIsHandedNothing: a replica marked leaving is
// no peer (LiveReplicas says so), a lease is not transferred to it, a
// lease handed to it just before its mark is not adopted by it nor
// acquired in passing, and its giver passes it on to a replica that
// stays, which adopts it; once adopted, it is passed nowhere.
func TestPostgresLeavingReplicaIsHandedNothing(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("leaving")
	ctx := context.Background()
	const ttl = time.Minute
	var rs []*Postgres
	for _, id := range []string{"a", "b", "c"} {
		p := openPG(t, url, PostgresOptions{Replica: id})
		defer p.Close()
		must(t, p.JoinReplicas(ctx, "http://"+id+":8888"))
		rs = append(rs, p)
	}
	a, b, c := rs[0], rs[1], rs[2]
	k1, err := a.AcquireLease(ctx, "k1", ttl)
	must(t, err)
	k2, err := a.AcquireLease(ctx, "k2", ttl)
	must(t, err)

	// k1 handed to b, then b marked leaving (the instant between).
	handed, err := a.TransferLease(ctx, k1.Fence(), "b", ttl)
	must(t, err)
	must(t, b.MarkLeaving(ctx))
	live, err := c.LiveReplicas(ctx, ttl)
	must(t, err)
	for _, r := range live {
		if r.Leaving != (r.ID == "b") {
			t.Errorf("replica %s: leaving %v", r.ID, r.Leaving)
		}
	}
	if err := b.AdoptLease(ctx, handed.Fence(), ttl); !errors.Is(err, ErrReplicaLeaving) {
		t.Errorf("b, leaving, adopting the lease handed to it: %v, want ErrReplicaLeaving", err)
	}
	if _, err := b.AcquireLease(ctx, "k1", ttl); !errors.Is(err, ErrLeaseHeld) {
		t.Errorf("b acquiring the lease handed to it: %v, want ErrLeaseHeld", err)
	}
	if _, err := a.TransferLease(ctx, k2.Fence(), "b", ttl); !errors.Is(err, ErrReplicaLeaving) {
		t.Errorf("a lease transferred to b, leaving: %v, want ErrReplicaLeaving", err)
	}
	if _, err := a.PassLease(ctx, handed.Fence(), "b", "b", ttl); !errors.Is(err, ErrReplicaLeaving) {
		t.Errorf("the handed lease passed to b, leaving: %v, want ErrReplicaLeaving", err)
	}

	// a passes it on to c, which adopts it.
	passed, err := a.PassLease(ctx, handed.Fence(), "b", "c", ttl)
	must(t, err)
	if passed.Owner != "c" || passed.OwnerURL != "http://c:8888" || passed.Epoch != handed.Epoch+1 {
		t.Errorf("the lease passed on: %+v, want c's under epoch %d", passed, handed.Epoch+1)
	}
	must(t, c.AdoptLease(ctx, passed.Fence(), ttl))
	if _, err := a.PassLease(ctx, passed.Fence(), "c", "a", ttl); !errors.Is(err, ErrNotHanded) {
		t.Errorf("a lease adopted, passed on: %v, want ErrNotHanded", err)
	}
	if _, err := a.PassLease(ctx, handed.Fence(), "b", "a", ttl); !errors.Is(err, ErrNotHanded) {
		t.Errorf("the lease b had, passed on again: %v, want ErrNotHanded", err)
	}
	owner, err := a.LeaseOwner(ctx, "k1")
	must(t, err)
	if owner.Owner != "c" || owner.Epoch != passed.Epoch {
		t.Errorf("k1's lease: %+v, want c's under epoch %d", owner, passed.Epoch)
	}
	// The next process of b's id is not leaving.
	must(t, b.JoinReplicas(ctx, "http://b:8888"))
	if _, err := a.TransferLease(ctx, k2.Fence(), "b", ttl); err != nil {
		t.Errorf("a lease transferred to b started again: %v", err)
	}
}

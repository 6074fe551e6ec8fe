package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// What replicas read of each other's records: the listings of a replica
// that did not answer in time (Listing), the context tokens another
// replica minted (ContextByToken), and the claim of a context every
// replica may make, such as a language's shared one (ClaimContext).

// ErrNoToken: no context record keeps a token of that hash.
var ErrNoToken = errors.New("state: no context keeps that token")

// Owned is a record with the replica that holds the lease of its kernel:
// Owner its id and OwnerURL its advertised URL, both "" when no replica
// holds it (a context without a kernel, a kernel being taken over).
type Owned[T any] struct {
	Rec             T
	Owner, OwnerURL string
}

// Listing is every kernel, context, Jupyter session and sandbox record
// with the owner of its kernel (a sandbox: of its default context's,
// "e2b-<id>-python").
type Listing struct {
	Kernels   []Owned[Kernel]
	Contexts  []Owned[Context]
	Sessions  []Owned[Session]
	Sandboxes []Owned[Sandbox]
}

// The lease held on a kernel id, joined with its holder's row.
const heldLeaseJoin = `LEFT JOIN leases l ON l.kernel_id = %s AND l.owner <> '' AND l.expires_at > now()
	LEFT JOIN replicas r ON r.id = l.owner`

// Listing reads every record with the owner of its kernel, in one round
// trip. A record that does not decode is left out.
func (p *Postgres) Listing(ctx context.Context) (*Listing, error) {
	l := &Listing{}
	var b pgx.Batch
	queueOwned(&b, "SELECT t.data::text, coalesce(l.owner, ''), coalesce(r.url, '') FROM kernels t "+
		fmt.Sprintf(heldLeaseJoin, "t.id")+" ORDER BY t.id", &l.Kernels)
	queueOwned(&b, "SELECT t.data::text, coalesce(l.owner, ''), coalesce(r.url, '') FROM contexts t "+
		fmt.Sprintf(heldLeaseJoin, "t.data->>'kernelId'")+" ORDER BY t.id", &l.Contexts)
	queueOwned(&b, "SELECT t.data::text, coalesce(l.owner, ''), coalesce(r.url, '') FROM sessions t "+
		fmt.Sprintf(heldLeaseJoin, "t.data->>'kernelId'")+" ORDER BY t.id", &l.Sessions)
	queueOwned(&b, "SELECT t.data::text, coalesce(l.owner, ''), coalesce(r.url, '') FROM sandboxes t "+
		"LEFT JOIN contexts c ON c.id = 'e2b-' || t.id || '-python' "+
		fmt.Sprintf(heldLeaseJoin, "c.data->>'kernelId'")+" ORDER BY t.id", &l.Sandboxes)
	if err := p.pool.SendBatch(ctx, &b).Close(); err != nil {
		return nil, p.replicaCall(err)
	}
	return l, nil
}

func queueOwned[T any](b *pgx.Batch, sql string, out *[]Owned[T]) {
	b.Queue(sql).Query(func(rows pgx.Rows) error {
		var data string
		var o Owned[T]
		_, err := pgx.ForEachRow(rows, []any{&data, &o.Owner, &o.OwnerURL}, func() error {
			var rec T
			if json.Unmarshal([]byte(data), &rec) == nil {
				*out = append(*out, Owned[T]{Rec: rec, Owner: o.Owner, OwnerURL: o.OwnerURL})
			}
			return nil
		})
		return err
	})
}

// ContextByToken returns the record of the context that keeps a token of
// hash (TokenHash.Hash), whoever minted it; ErrNoToken when none does. One
// statement.
func (p *Postgres) ContextByToken(ctx context.Context, hash [32]byte) (Context, error) {
	// Containment of {"hash": […]} in the tokens array; the expiry is
	// the caller's to check.
	want, _ := json.Marshal([]map[string]any{{"hash": hash}})
	var data string
	err := p.pool.QueryRow(ctx, `SELECT data::text FROM contexts
		WHERE (data::jsonb) -> 'tokens' @> $1::jsonb LIMIT 1`, string(want)).Scan(&data)
	if errors.Is(err, pgx.ErrNoRows) {
		return Context{}, ErrNoToken
	}
	if err != nil {
		return Context{}, p.replicaCall(err)
	}
	var c Context
	if err := json.Unmarshal([]byte(data), &c); err != nil {
		return Context{}, fmt.Errorf("state: context record: %w", err)
	}
	return c, nil
}

// ClaimContext writes rec, the record of a context whose kernel
// (rec.KernelID) this replica holds under f, unless the record of that
// id names a kernel whose lease another replica holds: then it writes
// nothing and returns that lease with ErrLeaseHeld. Claims of one id are
// serialised in the database, so of replicas claiming a context at once
// exactly one wins; the others are told the winner. ErrFenced when f is
// not held.
func (p *Postgres) ClaimContext(ctx context.Context, rec Context, f Fence) (Lease, error) {
	if p.replica == "" {
		return Lease{}, ErrNotReplica
	}
	if rec.ID == "" || rec.KernelID != f.Kernel {
		return Lease{}, ErrInvalid
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return Lease{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return Lease{}, p.replicaCall(err)
	}
	defer tx.Rollback(context.Background())
	// Each statement after the lock sees what the claim before it
	// committed (read committed).
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended('kernelgate-claim:' || $1, 0))", rec.ID); err != nil {
		return Lease{}, p.replicaCall(err)
	}
	var held Lease
	err = tx.QueryRow(ctx, `SELECT l.kernel_id, l.owner, coalesce(r.url, ''), l.epoch, l.expires_at
		FROM contexts c JOIN leases l ON l.kernel_id = c.data->>'kernelId' LEFT JOIN replicas r ON r.id = l.owner
		WHERE c.id = $1 AND l.owner <> '' AND l.owner <> $2 AND l.expires_at > now()`, rec.ID, p.replica).
		Scan(&held.Kernel, &held.Owner, &held.OwnerURL, &held.Epoch, &held.Expires)
	switch {
	case err == nil:
		return held, fmt.Errorf("%w: context %s (kernel %s, owner %s)", ErrLeaseHeld, rec.ID, held.Kernel, held.Owner)
	case !errors.Is(err, pgx.ErrNoRows):
		return Lease{}, p.replicaCall(err)
	}
	_, err = tx.Exec(ctx, "SELECT kg_check_fences(ARRAY[$1::text], ARRAY[$2::bigint], $3)", f.Kernel, f.Epoch, p.replica)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == pgFencedCode {
		return Lease{}, fencedError(&f)
	}
	if err != nil {
		return Lease{}, p.replicaCall(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO contexts (id, data) VALUES ($1, $2)
		ON CONFLICT (id) DO UPDATE SET data = excluded.data`, rec.ID, string(data)); err != nil {
		return Lease{}, p.replicaCall(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Lease{}, p.replicaCall(err)
	}
	return Lease{Kernel: f.Kernel, Owner: p.replica, Epoch: f.Epoch}, nil
}

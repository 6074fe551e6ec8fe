package state

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// What replicas sharing a database keep in it (pgschema/0002): their own
// rows, and one lease per kernel with its fencing epoch. Every time is
// the database's (now()), never a replica's clock. These calls go to the
// database at once (not through the write queue) and need a store opened
// as a replica (PostgresOptions.Replica).

// Errors of the replicas' calls.
var (
	// ErrNotReplica: the store was opened as a database's one gateway,
	// not as a replica.
	ErrNotReplica = errors.New("state: the store is not opened as a replica")
	// ErrLeaseHeld: another replica holds the kernel's lease.
	ErrLeaseHeld = errors.New("state: another replica holds the kernel's lease")
	// ErrNoLease: no replica holds the kernel's lease (never taken,
	// released, or lapsed).
	ErrNoLease = errors.New("state: no replica holds the kernel's lease")
	// ErrNoReplica: no live replica has that id.
	ErrNoReplica = errors.New("state: no live replica of that id")
	// ErrReplicaLeaving: the replica is leaving (MarkLeaving): it is
	// handed no lease and adopts none.
	ErrReplicaLeaving = errors.New("state: the replica is leaving")
	// ErrNotHanded: the lease is no longer the unadopted one handed to
	// its owner (adopted, passed on, or lapsed).
	ErrNotHanded = errors.New("state: the lease is no longer handed over and unadopted")
)

// Replica is a row of the replicas table.
type Replica struct {
	ID string
	// URL is the address other replicas reach it at.
	URL string
	// Started is when it joined, Heard when it last said it is alive
	// (the database's clock).
	Started, Heard time.Time
	// Leaving: it hands its kernels over as it stops (MarkLeaving).
	Leaving bool
}

// Lease is a kernel's lease: who owns the kernel, and under which epoch.
type Lease struct {
	Kernel string
	// Owner is the holder's replica id, OwnerURL its advertised URL (""
	// when its row is gone).
	Owner, OwnerURL string
	Epoch           int64
	// Expires is when it lapses unless renewed (the database's clock).
	Expires time.Time
}

// Fence is the fence of writes made under the lease.
func (l Lease) Fence() Fence { return Fence{l.Kernel, l.Epoch} }

// Replica is the id this store was opened as a replica under, "" for a
// database's one gateway.
func (p *Postgres) Replica() string { return p.replica }

// fenced makes Fenced check fences on a replica's store.
func (p *Postgres) fenced(f Fence) Writer {
	if p.replica == "" {
		return p
	}
	return queueWriter{q: &p.writeQueue, fence: &f}
}

var _ fencer = (*Postgres)(nil)

// micros is d in whole microseconds, at least 1, for "$n * interval '1
// microsecond'".
func micros(d time.Duration) int64 { return max(d.Microseconds(), 1) }

// clocked returns b after kg_tick (pgschema/0003), in one round trip and
// one implicit transaction: the leases and replicas b judges are those
// of a clock that did not run while no replica reached the database.
// alive, the replica's lease, is given by the calls that say this
// replica is alive (heartbeat, acquisition, renewal): they set the
// clock; 0 only reads it.
func clocked(b *pgx.Batch, alive time.Duration) *pgx.Batch {
	var c pgx.Batch
	if alive > 0 {
		c.Queue("SELECT kg_tick($1 * interval '1 microsecond')", micros(alive))
	} else {
		c.Queue("SELECT kg_tick(NULL)")
	}
	c.QueuedQueries = append(c.QueuedQueries, b.QueuedQueries...)
	return &c
}

// sendClocked sends b after the clock's tick (clocked).
func (p *Postgres) sendClocked(ctx context.Context, b *pgx.Batch, alive time.Duration) error {
	return p.pool.SendBatch(ctx, clocked(b, alive)).Close()
}

// rowClocked is QueryRow(sql).Scan(dest...) after the clock's tick
// (clocked): pgx.ErrNoRows when there is no row.
func (p *Postgres) rowClocked(ctx context.Context, sql string, args []any, dest ...any) error {
	var b pgx.Batch
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error { return row.Scan(dest...) })
	return p.sendClocked(ctx, &b, 0)
}

func (p *Postgres) replicaCall(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("state: %w", p.clean(err))
}

// JoinReplicas writes this replica's row, advertising url, as started
// now: a row of an earlier process of the same id is replaced.
func (p *Postgres) JoinReplicas(ctx context.Context, url string) error {
	if p.replica == "" {
		return ErrNotReplica
	}
	_, err := p.pool.Exec(ctx, `INSERT INTO replicas (id, url, started_at, heard_at) VALUES ($1, $2, now(), now())
		ON CONFLICT (id) DO UPDATE SET url = excluded.url, started_at = now(), heard_at = now(), leaving = false`, p.replica, url)
	return p.replicaCall(err)
}

// Heartbeat says this replica is alive (its row written again if it was
// removed) and returns the live replicas: those heard from within the
// last `within`, this one among them, ordered by id. One round trip.
func (p *Postgres) Heartbeat(ctx context.Context, url string, within time.Duration) ([]Replica, error) {
	if p.replica == "" {
		return nil, ErrNotReplica
	}
	var b pgx.Batch
	b.Queue(`INSERT INTO replicas (id, url) VALUES ($1, $2)
		ON CONFLICT (id) DO UPDATE SET url = excluded.url, heard_at = now()`, p.replica, url)
	var live []Replica
	b.Queue(liveReplicasSQL, micros(within)).Query(func(rows pgx.Rows) error {
		var err error
		live, err = scanReplicas(rows)
		return err
	})
	err := p.sendClocked(ctx, &b, within)
	if err != nil {
		return nil, p.replicaCall(err)
	}
	return live, nil
}

const liveReplicasSQL = `SELECT id, url, started_at, heard_at, leaving FROM replicas
	WHERE heard_at > now() - $1 * interval '1 microsecond' ORDER BY id`

func scanReplicas(rows pgx.Rows) ([]Replica, error) {
	var out []Replica
	var r Replica
	_, err := pgx.ForEachRow(rows, []any{&r.ID, &r.URL, &r.Started, &r.Heard, &r.Leaving}, func() error {
		out = append(out, r)
		return nil
	})
	return out, err
}

// LiveReplicas returns the replicas heard from within the last `within`,
// ordered by id.
func (p *Postgres) LiveReplicas(ctx context.Context, within time.Duration) ([]Replica, error) {
	var live []Replica
	var b pgx.Batch
	b.Queue(liveReplicasSQL, micros(within)).Query(func(rows pgx.Rows) error {
		var err error
		live, err = scanReplicas(rows)
		return err
	})
	err := p.sendClocked(ctx, &b, 0)
	return live, p.replicaCall(err)
}

// LeaveReplicas removes this replica's row (a clean stop).
func (p *Postgres) LeaveReplicas(ctx context.Context) error {
	if p.replica == "" {
		return ErrNotReplica
	}
	_, err := p.pool.Exec(ctx, "DELETE FROM replicas WHERE id = $1", p.replica)
	return p.replicaCall(err)
}

// MarkLeaving marks this replica leaving: from now on no lease is
// transferred or passed to it, and it adopts none handed to it
// (AdoptLease). A transfer to it that was being made meanwhile is
// committed first (its row is locked by both), so that one either lands
// before the mark, for the replica to adopt or refuse, or is refused.
func (p *Postgres) MarkLeaving(ctx context.Context) error {
	if p.replica == "" {
		return ErrNotReplica
	}
	_, err := p.pool.Exec(ctx, "UPDATE replicas SET leaving = true WHERE id = $1", p.replica)
	return p.replicaCall(err)
}

// AcquireLease takes the kernel's lease for this replica, for ttl, if no
// other replica holds it (never taken, released, or lapsed), or if this
// one does: each success starts a new term, its epoch one more than the
// last (1 the first time), so writes under an earlier epoch are refused
// from now on. When another replica holds it, it returns that lease and
// ErrLeaseHeld. Of replicas acquiring a free lease at once, one wins.
func (p *Postgres) AcquireLease(ctx context.Context, kernel string, ttl time.Duration) (Lease, error) {
	if p.replica == "" {
		return Lease{}, ErrNotReplica
	}
	if kernel == "" {
		return Lease{}, ErrInvalid
	}
	l := Lease{Kernel: kernel, Owner: p.replica}
	var b pgx.Batch
	b.Queue(`INSERT INTO leases AS l (kernel_id, owner, epoch, expires_at)
		VALUES ($1, $2, 1, now() + $3 * interval '1 microsecond')
		ON CONFLICT (kernel_id) DO UPDATE SET owner = excluded.owner, epoch = l.epoch + 1, expires_at = excluded.expires_at, handed = false
		WHERE l.owner = excluded.owner AND NOT l.handed OR l.owner = '' OR l.expires_at <= now()
		RETURNING epoch, expires_at`, kernel, p.replica, micros(ttl)).QueryRow(func(row pgx.Row) error {
		return row.Scan(&l.Epoch, &l.Expires)
	})
	b.Queue("SELECT url FROM replicas WHERE id = $1", p.replica).QueryRow(func(row pgx.Row) error {
		if err := row.Scan(&l.OwnerURL); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		return nil
	})
	err := p.sendClocked(ctx, &b, ttl)
	if errors.Is(err, pgx.ErrNoRows) {
		held, err := p.LeaseOwner(ctx, kernel)
		if err != nil && !errors.Is(err, ErrNoLease) {
			return Lease{}, err
		}
		return held, fmt.Errorf("%w: kernel %s (owner %s)", ErrLeaseHeld, kernel, held.Owner)
	}
	if err != nil {
		return Lease{}, p.replicaCall(err)
	}
	return l, nil
}

// RenewLeases extends, by ttl from now, those of the leases held (kernel
// and epoch) that this replica still holds unlapsed, in one statement,
// and returns them; the others are lost (lapsed, taken or handed over)
// and are not renewed.
func (p *Postgres) RenewLeases(ctx context.Context, held []Fence, ttl time.Duration) ([]Fence, error) {
	if p.replica == "" {
		return nil, ErrNotReplica
	}
	if len(held) == 0 {
		return nil, nil
	}
	kernels, epochs := make([]string, len(held)), make([]int64, len(held))
	for i, f := range held {
		kernels[i], epochs[i] = f.Kernel, f.Epoch
	}
	// The rows are locked in kernel_id order first, as kg_check_fences
	// locks them, so that a renewal and a fenced commit never deadlock.
	var still []Fence
	var b pgx.Batch
	b.Queue(`WITH held AS (
			SELECT l.kernel_id FROM leases l, unnest($1::text[], $2::bigint[]) AS h(k, e)
			WHERE l.kernel_id = h.k AND l.epoch = h.e AND l.owner = $3 AND l.expires_at > now()
			ORDER BY l.kernel_id FOR UPDATE OF l)
		UPDATE leases AS l SET expires_at = now() + $4 * interval '1 microsecond'
		FROM held WHERE l.kernel_id = held.kernel_id
		RETURNING l.kernel_id, l.epoch`, kernels, epochs, p.replica, micros(ttl)).Query(func(rows pgx.Rows) error {
		var f Fence
		_, err := pgx.ForEachRow(rows, []any{&f.Kernel, &f.Epoch}, func() error {
			still = append(still, f)
			return nil
		})
		return err
	})
	err := p.sendClocked(ctx, &b, ttl)
	if err != nil {
		return nil, p.replicaCall(err)
	}
	return still, nil
}

// ReleaseLease gives up the lease f, if this replica holds it with f's
// epoch: the kernel is free for any replica to acquire (with the next
// epoch). Releasing a lease not held does nothing.
func (p *Postgres) ReleaseLease(ctx context.Context, f Fence) error {
	if p.replica == "" {
		return ErrNotReplica
	}
	_, err := p.pool.Exec(ctx, `UPDATE leases SET owner = '', expires_at = now()
		WHERE kernel_id = $1 AND epoch = $2 AND owner = $3`, f.Kernel, f.Epoch, p.replica)
	return p.replicaCall(err)
}

// TransferLease hands the lease f, held by this replica, to the live
// replica `to` that is not leaving, for ttl, under the next epoch, and
// returns the new lease, handed (its new owner adopts it: AdoptLease):
// from then on the writes under f are refused and `to` finds itself the
// owner (LeaseOwner). ErrFenced when f is not held, ErrNoReplica when
// `to` is not live, ErrReplicaLeaving when it is leaving.
func (p *Postgres) TransferLease(ctx context.Context, f Fence, to string, ttl time.Duration) (Lease, error) {
	if p.replica == "" {
		return Lease{}, ErrNotReplica
	}
	l := Lease{Kernel: f.Kernel, Owner: to}
	err := p.rowClocked(ctx, handLeaseSQL(false), []any{f.Kernel, f.Epoch, p.replica, to, micros(ttl)}, &l.Epoch, &l.Expires, &l.OwnerURL)
	if errors.Is(err, pgx.ErrNoRows) {
		if err := p.whyNotHanded(ctx, to, ttl); err != nil {
			return Lease{}, err
		}
		return Lease{}, fencedError(&f)
	}
	if err != nil {
		return Lease{}, p.replicaCall(err)
	}
	return l, nil
}

// handLeaseSQL moves the lease ($1 kernel, $2 epoch, held by $3, and
// handed or not as handed says) to the live replica $4 that is not
// leaving, for $5 µs, under the next epoch, handed. The receiver's row is
// locked, so that MarkLeaving waits for the move (and sees it) or the
// move sees the mark.
func handLeaseSQL(handed bool) string {
	cond := "NOT l.handed"
	if handed {
		cond = "l.handed"
	}
	return `WITH r AS (SELECT id, url FROM replicas
			WHERE id = $4 AND heard_at > now() - $5 * interval '1 microsecond' AND NOT leaving FOR SHARE)
		UPDATE leases AS l SET owner = r.id, epoch = l.epoch + 1,
			expires_at = now() + $5 * interval '1 microsecond', handed = true
		FROM r
		WHERE l.kernel_id = $1 AND l.epoch = $2 AND l.owner = $3 AND l.expires_at > now() AND ` + cond + `
		RETURNING l.epoch, l.expires_at, r.url`
}

// whyNotHanded says why a lease could not go to `to`: ErrNoReplica when
// it is not live, ErrReplicaLeaving when it is leaving; nil when it
// could have taken it.
func (p *Postgres) whyNotHanded(ctx context.Context, to string, ttl time.Duration) error {
	live, err := p.LiveReplicas(ctx, ttl)
	if err != nil {
		return err
	}
	for _, r := range live {
		if r.ID == to && r.Leaving {
			return fmt.Errorf("%w: %q", ErrReplicaLeaving, to)
		}
		if r.ID == to {
			return nil
		}
	}
	return fmt.Errorf("%w: %q", ErrNoReplica, to)
}

// AdoptLease makes the lease f, handed to this replica (TransferLease,
// PassLease), this replica's own, renewed for ttl: from then on it is
// kept as any lease acquired. ErrReplicaLeaving when this replica is
// leaving (the lease stays handed, for its giver to pass on), ErrNoLease
// when f is not held by this replica.
func (p *Postgres) AdoptLease(ctx context.Context, f Fence, ttl time.Duration) error {
	if p.replica == "" {
		return ErrNotReplica
	}
	var epoch int64
	err := p.rowClocked(ctx, `WITH me AS (SELECT id FROM replicas WHERE id = $3 AND NOT leaving FOR SHARE)
		UPDATE leases AS l SET handed = false, expires_at = now() + $4 * interval '1 microsecond'
		FROM me
		WHERE l.kernel_id = $1 AND l.epoch = $2 AND l.owner = me.id AND l.expires_at > now()
		RETURNING l.epoch`, []any{f.Kernel, f.Epoch, p.replica, micros(ttl)}, &epoch)
	if errors.Is(err, pgx.ErrNoRows) {
		var leaving bool
		err := p.pool.QueryRow(ctx, "SELECT leaving FROM replicas WHERE id = $1", p.replica).Scan(&leaving)
		if err == nil && leaving {
			return fmt.Errorf("%w: kernel %s is not adopted", ErrReplicaLeaving, f.Kernel)
		}
		return fmt.Errorf("%w: kernel %s", ErrNoLease, f.Kernel)
	}
	return p.replicaCall(err)
}

// PassLease passes the lease f, handed to the replica `from` and not
// adopted by it (it refused: it is leaving, or it did not answer), on to
// the live replica `to` that is not leaving, under the next epoch,
// handed, and returns it. Any replica may: `from` never acted under f,
// and cannot adopt it once it moved. ErrNotHanded when f is no longer
// that (adopted meanwhile, passed on, lapsed), ErrNoReplica or
// ErrReplicaLeaving when `to` cannot take it.
func (p *Postgres) PassLease(ctx context.Context, f Fence, from, to string, ttl time.Duration) (Lease, error) {
	if p.replica == "" {
		return Lease{}, ErrNotReplica
	}
	l := Lease{Kernel: f.Kernel, Owner: to}
	err := p.rowClocked(ctx, handLeaseSQL(true), []any{f.Kernel, f.Epoch, from, to, micros(ttl)}, &l.Epoch, &l.Expires, &l.OwnerURL)
	if errors.Is(err, pgx.ErrNoRows) {
		var still bool
		err := p.rowClocked(ctx, `SELECT EXISTS (SELECT 1 FROM leases WHERE kernel_id = $1 AND epoch = $2
			AND owner = $3 AND handed AND expires_at > now())`, []any{f.Kernel, f.Epoch, from}, &still)
		if err != nil {
			return Lease{}, p.replicaCall(err)
		}
		if !still {
			return Lease{}, fmt.Errorf("%w: kernel %s", ErrNotHanded, f.Kernel)
		}
		if err := p.whyNotHanded(ctx, to, ttl); err != nil {
			return Lease{}, err
		}
		return Lease{}, fmt.Errorf("%w: %q", ErrNoReplica, to)
	}
	if err != nil {
		return Lease{}, p.replicaCall(err)
	}
	return l, nil
}

// LeaseOwner returns the kernel's lease while a replica holds it (with
// its advertised URL), ErrNoLease otherwise.
func (p *Postgres) LeaseOwner(ctx context.Context, kernel string) (Lease, error) {
	l := Lease{Kernel: kernel}
	err := p.rowClocked(ctx, `SELECT l.owner, coalesce(r.url, ''), l.epoch, l.expires_at
		FROM leases l LEFT JOIN replicas r ON r.id = l.owner
		WHERE l.kernel_id = $1 AND l.owner <> '' AND l.expires_at > now()`, []any{kernel}, &l.Owner, &l.OwnerURL, &l.Epoch, &l.Expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, fmt.Errorf("%w: kernel %s", ErrNoLease, kernel)
	}
	if err != nil {
		return Lease{}, p.replicaCall(err)
	}
	return l, nil
}

// PeerKernels returns how many kernels the other replicas run: those
// whose lease another replica holds, unlapsed. A kernel counts from its
// owner's acquisition until its release, or until its lease lapses one
// lease after its owner last renewed (a dead owner's kernels count that
// long, then the adopter's lease counts them). One statement, on the
// leases table alone (one row per kernel ever owned).
func (p *Postgres) PeerKernels(ctx context.Context) (int, error) {
	if p.replica == "" {
		return 0, ErrNotReplica
	}
	var n int
	err := p.rowClocked(ctx, `SELECT count(*) FROM leases
		WHERE owner <> '' AND owner <> $1 AND expires_at > now()`, []any{p.replica}, &n)
	return n, p.replicaCall(err)
}

// LeaseClaimed says whether a replica holds the kernel's lease, or held
// it until less than grace ago without releasing it (its owner died or
// froze, and another replica may still adopt the kernel). One
// statement. A kernel never owned, or released, is claimed by no one.
func (p *Postgres) LeaseClaimed(ctx context.Context, kernel string, grace time.Duration) (bool, error) {
	var claimed bool
	err := p.rowClocked(ctx, `SELECT EXISTS (SELECT 1 FROM leases WHERE kernel_id = $1
		AND owner <> '' AND expires_at > now() - $2 * interval '1 microsecond')`, []any{kernel, micros(grace)}, &claimed)
	return claimed, p.replicaCall(err)
}

// Kinds of records OwnerOf finds the kernel of.
const (
	OfKernel  = "kernel"
	OfContext = "context"
	OfSession = "session"
	OfRun     = "run"
)

// ErrUnknownKind: OwnerOf was asked of a kind it does not know.
var ErrUnknownKind = errors.New("state: no such kind of record")

// OwnerOf returns the lease of the kernel a record belongs to (kind
// OfKernel: the kernel itself; OfContext, OfSession: the kernel the
// record names; OfRun: its context's kernel, else the kernel it ran on),
// with its holder's URL, in one round trip. ErrNoLease when the record
// is not there, names no kernel, or no replica holds that kernel's lease.
func (p *Postgres) OwnerOf(ctx context.Context, kind, id string) (Lease, error) {
	switch kind {
	case OfKernel, OfContext, OfSession, OfRun:
	default:
		return Lease{}, fmt.Errorf("%w: %q", ErrUnknownKind, kind)
	}
	var l Lease
	err := p.rowClocked(ctx, `WITH k AS (SELECT CASE $1::text
			WHEN 'kernel' THEN $2::text
			WHEN 'context' THEN (SELECT data->>'kernelId' FROM contexts WHERE id = $2)
			WHEN 'session' THEN (SELECT data->>'kernelId' FROM sessions WHERE id = $2)
			WHEN 'run' THEN (SELECT coalesce(nullif(c.data->>'kernelId', ''), r.j->>'kernel')
				FROM (SELECT convert_from(data, 'UTF8')::json AS j FROM runs WHERE id = $2) r
				LEFT JOIN contexts c ON c.id = r.j->>'context')
		END AS id)
		SELECT l.kernel_id, l.owner, coalesce(r.url, ''), l.epoch, l.expires_at
		FROM k JOIN leases l ON l.kernel_id = k.id LEFT JOIN replicas r ON r.id = l.owner
		WHERE l.owner <> '' AND l.expires_at > now()`, []any{kind, id}, &l.Kernel, &l.Owner, &l.OwnerURL, &l.Epoch, &l.Expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, fmt.Errorf("%w: %s %s", ErrNoLease, kind, id)
	}
	if err != nil {
		return Lease{}, p.replicaCall(err)
	}
	return l, nil
}

// FreeKernels returns the kernels with a record whose lease no replica
// holds: released (their owner stopped and left them running) or lapsed
// (their owner died, froze or was cut off). Any replica may take them
// over (AcquireLease).
func (p *Postgres) FreeKernels(ctx context.Context) ([]string, error) {
	var ids []string
	var b pgx.Batch
	b.Queue(`SELECT l.kernel_id FROM leases l JOIN kernels k ON k.id = l.kernel_id
		WHERE l.owner = '' OR l.expires_at <= now() ORDER BY l.kernel_id`).Query(func(rows pgx.Rows) error {
		var err error
		ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	err := p.sendClocked(ctx, &b, 0)
	return ids, p.replicaCall(err)
}

// Housekeep removes what no replica needs any more, and returns how many
// rows went: the rows of replicas not heard from for longer than
// deadFor (they died long ago: a clean stop removes its own row), and
// the lease rows of kernels that have no record (deleted, or never
// written: a warm-pool kernel) and that no replica has held for longer
// than deadFor (released, or lapsed with a dead owner). A lease held,
// or held until less than deadFor ago, is never removed, nor the lease
// of a kernel with a record (a replica may still take it over). Any
// replica may call it at any time; one round trip.
func (p *Postgres) Housekeep(ctx context.Context, deadFor time.Duration) (replicas, leases int, err error) {
	if p.replica == "" {
		return 0, 0, ErrNotReplica
	}
	var b pgx.Batch
	b.Queue(`DELETE FROM replicas WHERE id <> $1 AND heard_at < now() - $2 * interval '1 microsecond'`, p.replica, micros(deadFor)).Exec(func(tag pgconn.CommandTag) error {
		replicas = int(tag.RowsAffected())
		return nil
	})
	b.Queue(`DELETE FROM leases l WHERE l.expires_at < now() - $1 * interval '1 microsecond'
		AND NOT EXISTS (SELECT 1 FROM kernels k WHERE k.id = l.kernel_id)`, micros(deadFor)).Exec(func(tag pgconn.CommandTag) error {
		leases = int(tag.RowsAffected())
		return nil
	})
	if err := p.sendClocked(ctx, &b, 0); err != nil {
		return 0, 0, p.replicaCall(err)
	}
	return replicas, leases, nil
}

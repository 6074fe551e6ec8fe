package state

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Advisory lock keys of the PostgreSQL store (pg_advisory_lock's bigint
// space is shared by every client of a database: these are "kg" and a
// number).
const (
	// pgLockOwner is held, at session level, for as long as a gateway
	// runs: exclusively by the one gateway of a database, shared by each
	// replica of a database shared by replicas (so that one kind never
	// opens a database the other kind uses).
	pgLockOwner int64 = 0x6b67_0000_0001
	// pgLockMigrate is held, at transaction level, while the schema is
	// migrated.
	pgLockMigrate int64 = 0x6b67_0000_0002
)

// Defaults of PostgresOptions.
const (
	DefaultRetryMax     = 2 * time.Second
	DefaultCloseTimeout = 10 * time.Second
)

//go:embed pgschema/*.sql
var pgSchema embed.FS

// migration is one ordered step of the schema, its SQL embedded in the
// binary.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations reads pgschema/NNNN_name.sql in version order.
func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(pgSchema, "pgschema")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range entries {
		num, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("state: migration %q is not named NNNN_name.sql", e.Name())
		}
		sql, err := fs.ReadFile(pgSchema, "pgschema/"+e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, migration{v, name, string(sql)})
	}
	slices.SortFunc(out, func(a, b migration) int { return a.version - b.version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("state: migrations are not numbered 1, 2, …: %d is %q", i+1, m.name)
		}
	}
	return out, nil
}

// PGSchemaVersion is the newest schema this kernelgate knows.
func PGSchemaVersion() int {
	m, _ := migrations()
	return len(m)
}

// PostgresOptions tune a Postgres store; zero values take the defaults.
type PostgresOptions struct {
	Options
	// RetryMax bounds the wait between two attempts of a commit that
	// failed for want of the database.
	RetryMax time.Duration
	// CloseTimeout bounds how long Close waits for what is queued to be
	// committed (a commit under way, and its attempts again while the
	// database does not answer); past it, what is left is not written.
	CloseTimeout time.Duration
	// Replica, when set, opens the database as one of several replicas
	// sharing it, under this id (the id of its row in the replicas
	// table; unique among the replicas, stable for the life of the
	// process): other replicas may open it at the same time, and the
	// writes made under a Fence are checked against the leases this
	// replica holds. Empty: the one gateway of the database, which no
	// other process may open while it runs.
	Replica string
}

// maxReplicaID bounds the length of a replica's id.
const maxReplicaID = 200

func (o *PostgresOptions) defaults() {
	o.Options.defaults()
	if o.RetryMax <= 0 {
		o.RetryMax = DefaultRetryMax
	}
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = DefaultCloseTimeout
	}
}

// Postgres is the Store in a PostgreSQL database (13 or later), through a
// pgx connection pool that reconnects after the server restarts. Its
// writes go through one queue and one writer goroutine, as Bolt's: a
// durable write is committed at once with what is queued before it (one
// transaction for the lot), run writes wait up to FlushDelay for company,
// and a commit that fails because the database cannot be reached is
// tried again, in order, until it succeeds (or Close gives up). A
// durable write that returned nil is committed.
//
// One gateway uses a database at a time: Open takes a session-level
// advisory lock on a connection of its own and keeps it until Close. Or,
// opened with PostgresOptions.Replica, it is one of several replicas on
// the database, each taking that lock shared: the replicas' rows, the
// kernels' leases (postgres_replicas.go) and the writes under a Fence
// are theirs.
type Postgres struct {
	writeQueue
	replica      string // PostgresOptions.Replica
	pool         *pgxpool.Pool
	where        string // the URL without its password, for logs and errors
	secret       string // the URL's password, kept out of every error
	retryMax     time.Duration
	closeTimeout time.Duration
	// writeCtx is the parent of every commit attempt; Close cancels it
	// CloseTimeout after it starts, which bounds how long it waits.
	writeCtx    context.Context
	cancelWrite context.CancelFunc
	lockEnd     chan struct{} // the lock keeper has ended
}

var _ Store = (*Postgres)(nil)

// RedactURL returns rawURL with its password replaced by "xxxxx", for
// logs and errors. A URL that does not parse is replaced whole.
func RedactURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(a URL that does not parse)"
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// urlPassword is the password rawURL holds, "" without one.
func urlPassword(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	if p, ok := u.User.Password(); ok {
		return p
	}
	return u.Query().Get("password")
}

// redactedError is an error whose text had the password taken out.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// clean keeps the URL's password out of err's text.
func (p *Postgres) clean(err error) error {
	return redact(err, p.secret)
}

func redact(err error, secret string) error {
	if err == nil || secret == "" || !strings.Contains(err.Error(), secret) {
		return err
	}
	return &redactedError{strings.ReplaceAll(err.Error(), secret, "xxxxx"), err}
}

// OpenPostgres connects to the database at rawURL (postgres://…),
// brings its schema to PGSchemaVersion (under an advisory lock, so that
// processes starting together do not race) and takes the database for
// this process: while another kernelgate holds it, it fails with
// ErrLocked. ctx bounds the connection and the migrations.
func OpenPostgres(ctx context.Context, rawURL string, opts PostgresOptions) (*Postgres, error) {
	opts.defaults()
	secret := urlPassword(rawURL)
	where := RedactURL(rawURL)
	if len(opts.Replica) > maxReplicaID || strings.ContainsFunc(opts.Replica, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return nil, fmt.Errorf("%w: a replica id of at most %d printable characters", ErrInvalid, maxReplicaID)
	}
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, fmt.Errorf("state: %s: %w", where, redact(err, secret))
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("state: %s: %w", where, redact(err, secret))
	}
	p := &Postgres{replica: opts.Replica, pool: pool, where: where, secret: secret,
		retryMax: opts.RetryMax, closeTimeout: opts.CloseTimeout, lockEnd: make(chan struct{})}
	p.writeQueue = newWriteQueue(opts.Options, p.commitRetrying)
	p.writeCtx, p.cancelWrite = context.WithCancel(context.Background())
	lockConn, err := p.lockOwner(ctx)
	if err == nil {
		if err = p.migrate(ctx); err != nil {
			lockConn.Release()
		}
	}
	if err != nil {
		p.cancelWrite()
		pool.Close()
		return nil, err
	}
	go p.keepLock(lockConn)
	go p.writer()
	return p, nil
}

// lockOwner takes the owner lock on a connection it keeps out of the
// pool's use: exclusive for the one gateway, shared for a replica.
func (p *Postgres) lockOwner(ctx context.Context) (*pgxpool.Conn, error) {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("state: %s: %w", p.where, p.clean(err))
	}
	try := "SELECT pg_try_advisory_lock($1)"
	if p.replica != "" {
		try = "SELECT pg_try_advisory_lock_shared($1)"
	}
	var got bool
	if err := conn.QueryRow(ctx, try, pgLockOwner).Scan(&got); err != nil {
		conn.Release()
		return nil, fmt.Errorf("state: %s: %w", p.where, p.clean(err))
	}
	if !got {
		conn.Release()
		var pid int
		held := ""
		if err := p.pool.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND objid = $1::bigint & x'ffffffff'::bigint AND classid = $1::bigint >> 32 LIMIT 1`, pgLockOwner).Scan(&pid); err == nil {
			held = fmt.Sprintf(" (by the server process %d)", pid)
		}
		if p.replica != "" {
			return nil, fmt.Errorf("%w: the database %s is held%s by a kernelgate that is its one gateway, not a replica", ErrLocked, p.where, held)
		}
		return nil, fmt.Errorf("%w: the database %s is held%s: is another kernelgate running with this --state-url? One gateway per database is supported, unless all run as replicas", ErrLocked, p.where, held)
	}
	return conn, nil
}

// lockTick is how often keepLock checks the owner lock's connection.
const lockTick = time.Second

// keepLock holds the owner lock's connection until the writer has ended
// (after Close committed what was queued), so that the database is given
// up only after the last commit. When the server restarts, the lock goes
// with the connection: it takes it again once the server is back, and
// logs loudly (once, until that changes) if another process took it in
// between.
//
// The lock guards opening, not later writes: a gateway that lost it
// keeps writing, and nothing stops its writes from mixing with those of
// the process that took it. Replicas fence their writes about a kernel
// with its lease's epoch instead (Fenced).
func (p *Postgres) keepLock(conn *pgxpool.Conn) {
	defer close(p.lockEnd)
	tick := time.NewTicker(lockTick)
	defer tick.Stop()
	taken := false // another process holds the lock, and it was said
	for {
		select {
		case <-p.stopped:
			if conn != nil {
				// Unlocked first, so that the database is free when Close
				// returns (a closed connection's backend lets its locks go
				// only once it has noticed), then closed rather than
				// returned to the pool, in case the unlock did not get
				// through.
				ctx, cancel := context.WithTimeout(context.Background(), 3*lockTick)
				_, _ = conn.Exec(ctx, "SELECT pg_advisory_unlock_all()")
				cancel()
				conn.Conn().Close(context.Background())
				conn.Release()
			}
			return
		case <-tick.C:
		}
		// A few ticks, so that one slow round trip does not drop the lock.
		ctx, cancel := context.WithTimeout(context.Background(), 3*lockTick)
		if conn != nil {
			if err := conn.Ping(ctx); err != nil {
				conn.Conn().Close(ctx)
				conn.Release()
				conn = nil
				p.log.Warn("state: lost the connection to PostgreSQL; reconnecting", "db", p.where, "err", p.clean(err))
			}
		}
		if conn == nil {
			c, err := p.lockOwner(ctx)
			switch {
			case err == nil:
				conn, taken = c, false
				p.log.Info("state: PostgreSQL is back; the database is held again", "db", p.where)
			case errors.Is(err, ErrLocked) && !taken:
				taken = true
				p.log.Error("state: another process took the database while the connection was down", "db", p.where, "err", err)
			}
		}
		cancel()
	}
}

// migrate applies the migrations the database lacks, in one transaction
// under a transaction-level advisory lock. A database of a newer schema
// is refused (never changed).
func (p *Postgres) migrate(ctx context.Context) error {
	all, err := migrations()
	if err != nil {
		return err
	}
	fail := func(err error) error { return fmt.Errorf("state: migrating %s: %w", p.where, p.clean(err)) }
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", pgLockMigrate); err != nil {
		return fail(err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
		version int PRIMARY KEY, name text NOT NULL, applied timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fail(err)
	}
	var have int
	if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM schema_version").Scan(&have); err != nil {
		return fail(err)
	}
	if have > len(all) {
		return fmt.Errorf("state: the database %s was written by a newer kernelgate (schema %d; this one knows %d): it is left unchanged", p.where, have, len(all))
	}
	for _, m := range all[have:] {
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return fail(fmt.Errorf("%04d_%s: %w", m.version, m.name, err))
		}
		if _, err := tx.Exec(ctx, "INSERT INTO schema_version (version, name) VALUES ($1, $2)", m.version, m.name); err != nil {
			return fail(err)
		}
		p.log.Info("state: schema migrated", "db", p.where, "version", m.version, "name", m.name)
	}
	if err := tx.Commit(ctx); err != nil {
		return fail(err)
	}
	return nil
}

// Where is the database's URL without its password.
func (p *Postgres) Where() string { return p.where }

// commitRetrying commits batch, trying again while the database cannot
// be reached: a commit whose answer was lost with the connection may
// have been applied, and applying it again changes nothing (every write
// sets a row, or deletes it). It gives up only on an error of the data
// (which another attempt would repeat) or CloseTimeout after Close
// started (when p.writeCtx is cancelled).
func (p *Postgres) commitRetrying(batch []op) error {
	wait := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := p.commit(batch)
		if err == nil {
			if attempt > 1 {
				p.log.Info("state: committed after the database came back", "db", p.where, "attempts", attempt)
			}
			return nil
		}
		err = p.clean(err)
		if !retryable(err) {
			return fmt.Errorf("state: %w", err)
		}
		if attempt == 1 {
			p.log.Warn("state: the database does not answer; writes are kept and tried again", "db", p.where, "err", err)
		}
		select {
		case <-time.After(wait):
		case <-p.writeCtx.Done():
			return fmt.Errorf("state: the database did not come back within %v of closing: %w", p.closeTimeout, err)
		}
		wait = min(wait*2, p.retryMax)
	}
}

// retryable says err is the database's absence (a connection lost or
// refused, a server shutting down or starting), not a fault of the data.
func retryable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "08"), // connection exception
			strings.HasPrefix(pe.Code, "57P"), // admin shutdown, crash shutdown, cannot connect now
			strings.HasPrefix(pe.Code, "53"),  // insufficient resources
			pe.Code == "40001", pe.Code == "40P01":
			return true
		}
		return false
	}
	return true
}

// pgFencedCode is the SQLSTATE kg_check_fences raises (pgschema).
const pgFencedCode = "KG001"

// commit writes batch in one transaction, sent as one round trip. Writes
// made under a Fence (a replica's) are committed only if their leases are
// held: the transaction starts with kg_check_fences, which locks those
// lease rows and fails the whole transaction, naming the fences not
// held, if one is not. Then the ops under those fences are marked fenced
// (their owners are told ErrFenced) and the rest is committed again
// without them: a fence found not held never holds again, since epochs
// only grow.
func (p *Postgres) commit(batch []op) error {
	for {
		var fences []Fence
		index := map[Fence]int{}
		for _, o := range batch {
			if o.fence == nil || o.fenced || p.replica == "" {
				continue
			}
			if _, ok := index[*o.fence]; !ok {
				index[*o.fence] = len(fences)
				fences = append(fences, *o.fence)
			}
		}
		err := p.commitOnce(batch, fences)
		var pe *pgconn.PgError
		if len(fences) == 0 || !errors.As(err, &pe) || pe.Code != pgFencedCode {
			return err
		}
		var bad []int
		if jerr := json.Unmarshal([]byte(pe.Detail), &bad); jerr != nil || len(bad) == 0 {
			return err
		}
		refused := map[Fence]bool{}
		for _, i := range bad {
			if i >= 1 && i <= len(fences) {
				refused[fences[i-1]] = true
			}
		}
		if len(refused) == 0 {
			return err
		}
		for i := range batch {
			if f := batch[i].fence; f != nil && refused[*f] {
				batch[i].fenced = true
			}
		}
	}
}

// commitOnce writes batch, but the ops marked fenced, in one
// transaction, checking fences first. The batch is first reduced to what it leaves in each row (the last write
// of a record, of a run's data, of an event; a run deleted then written
// again is deleted first), so that it takes a few statements whatever
// its length: one per table and kind of change, rows passed as arrays.
func (p *Postgres) commitOnce(batch []op, fences []Fence) error {
	type runRows struct {
		deleted bool
		data    []byte
		hasData bool
		events  map[uint64][]byte
	}
	records := map[string]map[string][]byte{} // table → id → JSON, nil: deleted
	runs := map[string]*runRows{}
	run := func(id string) *runRows {
		r := runs[id]
		if r == nil {
			r = &runRows{}
			runs[id] = r
		}
		return r
	}
	for _, o := range batch {
		if o.fenced {
			continue
		}
		switch o.kind {
		case opPut, opDelete:
			t := records[string(o.bucket)]
			if t == nil {
				t = map[string][]byte{}
				records[string(o.bucket)] = t
			}
			t[o.key] = nil
			if o.kind == opPut {
				t[o.key] = o.val
			}
		case opPutRun:
			r := run(o.key)
			r.data, r.hasData = o.val, true
		case opEvents:
			r := run(o.key)
			if r.events == nil {
				r.events = map[uint64][]byte{}
			}
			for _, e := range o.events {
				r.events[e.Seq] = e.Data
			}
		case opDeleteRun:
			*run(o.key) = runRows{deleted: true}
		}
	}
	if len(records) == 0 && len(runs) == 0 {
		// A barrier only: nothing to write. Flush means the queue before
		// it is committed, and it is: the writer commits in order.
		return nil
	}
	// A batch is one implicit transaction: all of it or none.
	var b pgx.Batch
	if len(fences) > 0 {
		kernels, epochs := make([]string, len(fences)), make([]int64, len(fences))
		for i, f := range fences {
			kernels[i], epochs[i] = f.Kernel, f.Epoch
		}
		b.Queue("SELECT kg_check_fences($1::text[], $2::bigint[], $3)", kernels, epochs, p.replica)
	}
	for table, rows := range records {
		var del, ids, vals []string
		for id, v := range rows {
			if v == nil {
				del = append(del, id)
			} else {
				ids, vals = append(ids, id), append(vals, string(v))
			}
		}
		if len(del) > 0 {
			b.Queue("DELETE FROM "+table+" WHERE id = ANY($1)", del)
		}
		if len(ids) > 0 {
			b.Queue("INSERT INTO "+table+" (id, data) SELECT i, d::json FROM unnest($1::text[], $2::text[]) AS r(i, d) "+
				"ON CONFLICT (id) DO UPDATE SET data = excluded.data", ids, vals)
		}
	}
	var del, ids, evRuns []string
	var datas, evData [][]byte
	var evSeqs []int64
	for id, r := range runs {
		if r.deleted {
			del = append(del, id)
		}
		if r.hasData {
			ids, datas = append(ids, id), append(datas, r.data)
		}
		for seq, d := range r.events {
			evRuns, evSeqs, evData = append(evRuns, id), append(evSeqs, int64(seq)), append(evData, d)
		}
	}
	if len(del) > 0 {
		b.Queue("DELETE FROM runs WHERE id = ANY($1)", del)
		b.Queue("DELETE FROM run_events WHERE run_id = ANY($1)", del)
	}
	if len(ids) > 0 {
		b.Queue(`INSERT INTO runs (id, data) SELECT * FROM unnest($1::text[], $2::bytea[])
			ON CONFLICT (id) DO UPDATE SET data = excluded.data`, ids, datas)
	}
	if len(evRuns) > 0 {
		b.Queue(`INSERT INTO run_events (run_id, seq, data) SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[])
			ON CONFLICT (run_id, seq) DO UPDATE SET data = excluded.data`, evRuns, evSeqs, evData)
	}
	if b.Len() == 0 || (len(fences) > 0 && b.Len() == 1) {
		return nil
	}
	ctx, cancel := context.WithTimeout(p.writeCtx, 30*time.Second)
	defer cancel()
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	err = conn.SendBatch(ctx, &b).Close()
	var pe *pgconn.PgError
	if err != nil && !(errors.As(err, &pe) && pe.Code == pgFencedCode) {
		// The connection may be mid-transaction: never hand it back.
		conn.Conn().Close(context.Background())
	}
	return err
}

// Load flushes the queue and reads every record, within ctx (a
// database that does not answer fails it).
func (p *Postgres) Load(ctx context.Context) (*Snapshot, error) {
	if err := p.Flush(ctx); err != nil {
		return nil, err
	}
	snap := &Snapshot{}
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("state: %w", p.clean(err))
	}
	defer tx.Rollback(context.Background())
	if err := errors.Join(
		pgDecodeAll(ctx, p.log, tx, "kernels", &snap.Kernels),
		pgDecodeAll(ctx, p.log, tx, "contexts", &snap.Contexts),
		pgDecodeAll(ctx, p.log, tx, "sessions", &snap.Sessions),
		pgDecodeAll(ctx, p.log, tx, "sandboxes", &snap.Sandboxes),
	); err != nil {
		return nil, fmt.Errorf("state: %w", p.clean(err))
	}
	runs := map[string]int{}
	rows, _ := tx.Query(ctx, "SELECT id, data FROM runs")
	var id string
	var data []byte
	_, err = pgx.ForEachRow(rows, []any{&id, &data}, func() error {
		runs[id] = len(snap.Runs)
		snap.Runs = append(snap.Runs, Run{ID: id, Data: clone(data)})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("state: %w", p.clean(err))
	}
	// Events of a run whose data was never written still make a run.
	rows, _ = tx.Query(ctx, "SELECT run_id, seq, data FROM run_events ORDER BY run_id, seq")
	var seq int64
	_, err = pgx.ForEachRow(rows, []any{&id, &seq, &data}, func() error {
		i, ok := runs[id]
		if !ok {
			i = len(snap.Runs)
			runs[id] = i
			snap.Runs = append(snap.Runs, Run{ID: id})
		}
		snap.Runs[i].Events = append(snap.Runs[i].Events, Event{Seq: uint64(seq), Data: clone(data)})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("state: %w", p.clean(err))
	}
	snap.sort()
	return snap, nil
}

// pgDecodeAll appends every record of table to out; one that does not
// decode is logged and left out.
func pgDecodeAll[T any](ctx context.Context, log *slog.Logger, tx pgx.Tx, table string, out *[]T) error {
	rows, _ := tx.Query(ctx, "SELECT id, data::text FROM "+table)
	var id, data string
	_, err := pgx.ForEachRow(rows, []any{&id, &data}, func() error {
		var r T
		if err := json.Unmarshal([]byte(data), &r); err != nil {
			log.Error("state: a record does not decode and is not restored", "table", table, "id", id, "err", err)
			return nil
		}
		*out = append(*out, r)
		return nil
	})
	return err
}

// Close commits what is queued (for at most CloseTimeout from its start,
// however slow or absent the database), releases the database for another
// gateway and closes the pool.
func (p *Postgres) Close() error {
	// What is not committed CloseTimeout from now is given up.
	giveUp := time.AfterFunc(p.closeTimeout, p.cancelWrite)
	defer giveUp.Stop()
	first := p.closeQueue()
	p.cancelWrite()
	// keepLock releases the lock once the writer has ended.
	<-p.lockEnd
	if first {
		p.pool.Close()
	}
	return nil
}

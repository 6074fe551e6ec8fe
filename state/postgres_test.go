package state

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"kernelgate/internal/leakcheck"
	"kernelgate/internal/pgtest"
)

// TestPostgresRestart: the server is stopped (fast, then immediate)
// and started again while durable and queued writes go on. Every durable
// write that returned nil is in the database, the writes queued while it
// was down arrive, and the store takes the database again.
func TestPostgresRestart(t *testing.T) {
	before := leakcheck.Snapshot(t)
	srv := pgtest.Start(t)
	url := srv.CreateDB("restart")
	var logs logBuffer
	s := openPG(t, url, PostgresOptions{Options: Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, RetryMax: 200 * time.Millisecond})
	ctx := context.Background()
	acked := map[string]bool{}
	var mu sync.Mutex
	queued := 0
	write := func(round string, n int) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("%s-k%02d", round, i)
				wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
				if err := s.PutKernel(wctx, sampleKernel(id)); err == nil {
					mu.Lock()
					acked[id] = true
					mu.Unlock()
				}
			}()
		}
		for i := range n {
			id := fmt.Sprintf("%s-r%02d", round, i)
			must(t, s.PutRun(id, []byte(id)))
			must(t, s.AppendRunEvents(id, Event{1, []byte("e")}))
			queued++
		}
		wg.Wait()
	}
	for _, mode := range []string{"fast", "immediate"} {
		write(mode+"-before", 10)
		srv.Stop(mode)
		// Writes while the server is down: the durable ones time out
		// (not acknowledged), the queued ones wait in the store.
		write(mode+"-down", 10)
		srv.StartAgain()
		write(mode+"-after", 10)
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	must(t, s.Flush(fctx))
	snap, err := s.Load(fctx)
	must(t, err)
	have := map[string]bool{}
	for _, k := range snap.Kernels {
		have[k.ID] = true
	}
	for id := range acked {
		if !have[id] {
			t.Errorf("acknowledged kernel %s is not in the database", id)
		}
	}
	if len(snap.Runs) != queued {
		t.Errorf("%d runs in the database, %d were queued", len(snap.Runs), queued)
	}
	for _, r := range snap.Runs {
		if string(r.Data) != r.ID || len(r.Events) != 1 {
			t.Errorf("run %s: %q with %d events", r.ID, r.Data, len(r.Events))
		}
	}
	// The database is held again (the server says so): a second store
	// is refused.
	conn, err := pgx.Connect(fctx, url)
	must(t, err)
	waitUntil(t, func() bool {
		var n int
		err := conn.QueryRow(fctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND objid = $1::bigint & x'ffffffff'::bigint AND classid = $1::bigint >> 32`, pgLockOwner).Scan(&n)
		return err == nil && n == 1
	}, "the store to take the database again")
	if _, err := OpenPostgres(ctx, url, PostgresOptions{}); !errors.Is(err, ErrLocked) {
		t.Errorf("a second store after the restart: %v, want ErrLocked", err)
	}
	must(t, conn.Close(ctx))
	must(t, s.Close())
	if !strings.Contains(logs.String(), "tried again") {
		t.Errorf("the log does not say writes wait for the database:\n%s", logs.String())
	}
	leakcheck.Check(t, before)
}

// waitUntil polls ok until it holds, for at most 30 s.
func waitUntil(t *testing.T, ok func() bool, what string) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for !ok() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestPostgresOneGateway: a second store on a database another holds is
// refused with ErrLocked, saying so, without a password in the error;
// once the first is closed it opens and finds the records.
func TestPostgresOneGateway(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("one")
	ctx := context.Background()
	first := openPG(t, url, PostgresOptions{})
	must(t, first.PutKernel(ctx, sampleKernel("k1")))
	withPassword := strings.Replace(url, "postgres@", "postgres:s3cret-pw@", 1)
	_, err := OpenPostgres(ctx, withPassword, PostgresOptions{})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "another kernelgate") {
		t.Fatalf("second store: %v, want ErrLocked saying why", err)
	}
	if strings.Contains(err.Error(), "s3cret-pw") {
		t.Errorf("the error holds the password: %v", err)
	}
	must(t, first.Close())
	second := openPG(t, withPassword, PostgresOptions{})
	defer second.Close()
	snap, err := second.Load(ctx)
	must(t, err)
	if len(snap.Kernels) != 1 {
		t.Errorf("the second store finds %d kernels, want 1", len(snap.Kernels))
	}
}

// TestPostgresMigrations: stores opening at once on a new database
// migrate it once (the loser of the owner lock is refused, not broken);
// a database of a newer schema is refused and left unchanged; a bad URL's
// password is not in the error.
func TestPostgresMigrations(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("migrate")
	ctx := context.Background()
	var wg sync.WaitGroup
	stores := make([]*Postgres, 4)
	errs := make([]error, 4)
	for i := range stores {
		wg.Go(func() { stores[i], errs[i] = OpenPostgres(ctx, url, PostgresOptions{}) })
	}
	wg.Wait()
	opened := 0
	for i, err := range errs {
		switch {
		case err == nil:
			opened++
			must(t, stores[i].Close())
		case !errors.Is(err, ErrLocked):
			t.Errorf("store %d: %v, want ErrLocked or success", i, err)
		}
	}
	if opened == 0 {
		t.Fatal("no store opened")
	}
	// The migrations alone, at once on another new database (no owner
	// lock to order them): each is applied once.
	raceURL := srv.CreateDB("migrate_race")
	for i := range 4 {
		pool, err := pgxpool.New(ctx, raceURL)
		must(t, err)
		defer pool.Close()
		p := &Postgres{pool: pool, where: "race"}
		p.log = slog.New(slog.DiscardHandler)
		wg.Go(func() { errs[i] = p.migrate(ctx) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("migration %d at once with others: %v", i, err)
		}
	}
	race, err := pgx.Connect(ctx, raceURL)
	must(t, err)
	defer race.Close(ctx)
	var n int
	must(t, race.QueryRow(ctx, "SELECT count(*) FROM schema_version").Scan(&n))
	if n != PGSchemaVersion() {
		t.Errorf("migrations run at once left %d rows in schema_version, want %d", n, PGSchemaVersion())
	}

	conn, err := pgx.Connect(ctx, url)
	must(t, err)
	defer conn.Close(ctx)
	var versions, top int
	must(t, conn.QueryRow(ctx, "SELECT count(*), max(version) FROM schema_version").Scan(&versions, &top))
	if versions != PGSchemaVersion() || top != PGSchemaVersion() {
		t.Errorf("schema_version holds %d rows up to %d, want %d", versions, top, PGSchemaVersion())
	}
	_, err = conn.Exec(ctx, "INSERT INTO schema_version (version, name) VALUES ($1, 'future')", PGSchemaVersion()+1)
	must(t, err)
	_, err = OpenPostgres(ctx, url, PostgresOptions{})
	if err == nil || !strings.Contains(err.Error(), "newer kernelgate") {
		t.Errorf("a newer schema: %v, want a refusal", err)
	}
	must(t, conn.QueryRow(ctx, "SELECT count(*) FROM schema_version").Scan(&versions))
	if versions != PGSchemaVersion()+1 {
		t.Errorf("the newer database was changed: %d versions", versions)
	}
	bad := "postgres://kg:hunter2-pw@127.0.0.1:1/none?sslmode=disable&connect_timeout=1"
	_, err = OpenPostgres(ctx, bad, PostgresOptions{})
	if err == nil || strings.Contains(err.Error(), "hunter2-pw") {
		t.Errorf("an unreachable URL: %v, want an error without the password", err)
	}
}

// TestPostgresBusyWhileDown: while the server is down, run writes never
// wait for it: once MaxQueued bytes are queued they are refused with
// ErrBusy at once. Every write accepted arrives once it is back.
func TestPostgresBusyWhileDown(t *testing.T) {
	srv := pgtest.Start(t)
	s := openPG(t, srv.CreateDB("busy"), PostgresOptions{Options: Options{MaxQueued: 64 << 10}, RetryMax: 100 * time.Millisecond})
	defer s.Close()
	srv.Stop("immediate")
	blob := make([]byte, 4<<10)
	accepted := 0
	for i := 0; ; i++ {
		start := time.Now()
		err := s.PutRun(fmt.Sprintf("r%03d", i), blob)
		if d := time.Since(start); d > time.Second {
			t.Fatalf("PutRun waited %v for a server that is down", d)
		}
		if errors.Is(err, ErrBusy) {
			break
		}
		must(t, err)
		accepted++
		if i > 1000 {
			t.Fatal("run writes are never refused while the server is down")
		}
	}
	srv.StartAgain()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	must(t, s.Flush(ctx))
	// Room again once the queue is written.
	must(t, s.PutRun("after", blob))
	snap, err := s.Load(ctx)
	must(t, err)
	if len(snap.Runs) != accepted+1 {
		t.Errorf("%d runs in the database, %d were accepted", len(snap.Runs), accepted+1)
	}
}

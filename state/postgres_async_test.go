package state

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"kernelgate/internal/pgtest"
)

// TestPostgresCommitRunAsync: CommitRunAsync returns at once, also while
// the server is down; its callback is told of the commit once the
// server is back, and the record is then in the database.
func TestPostgresCommitRunAsync(t *testing.T) {
	srv := pgtest.Start(t)
	s := openPG(t, srv.CreateDB("async"), PostgresOptions{RetryMax: 100 * time.Millisecond})
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wait := func(done chan error) error {
		t.Helper()
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			t.Fatal("the commit's callback was never called")
			return nil
		}
	}
	up := make(chan error, 1)
	must(t, s.CommitRunAsync("up", []byte("1"), func(err error) { up <- err }))
	must(t, wait(up))

	srv.Stop("fast")
	down := make(chan error, 1)
	must(t, s.CommitRunAsync("down", []byte("2"), func(err error) { down <- err }))
	select {
	case err := <-down:
		t.Fatalf("a commit was reported (%v) while the server is down", err)
	default:
	}
	srv.StartAgain()
	must(t, wait(down))
	snap, err := s.Load(ctx)
	must(t, err)
	if len(snap.Runs) != 2 || string(snap.Runs[0].Data) != "2" || string(snap.Runs[1].Data) != "1" {
		t.Errorf("runs after the commits: %+v", snap.Runs)
	}
	if err := s.CommitRunAsync("", nil, func(error) { t.Error("called for a refused write") }); err != ErrInvalid {
		t.Errorf("no id: %v, want ErrInvalid", err)
	}
}

// TestPostgresCloseIsBounded: a commit that hangs (its table locked by
// another client) holds Close for no longer than CloseTimeout, and the
// write's callback is told that it was not written.
func TestPostgresCloseIsBounded(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("closebound")
	const closeTimeout = 500 * time.Millisecond
	s := openPG(t, url, PostgresOptions{CloseTimeout: closeTimeout})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	blocker, err := pgx.Connect(ctx, url)
	must(t, err)
	defer blocker.Close(context.Background())
	tx, err := blocker.Begin(ctx)
	must(t, err)
	defer tx.Rollback(context.Background())
	_, err = tx.Exec(ctx, "LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
	must(t, err)

	done := make(chan error, 1)
	must(t, s.CommitRunAsync("r", []byte("1"), func(err error) { done <- err }))
	waitUntil(t, func() bool {
		var waiting int
		must(t, tx.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE NOT granted").Scan(&waiting))
		return waiting > 0
	}, "the commit to wait for the locked table")
	start := time.Now()
	must(t, s.Close())
	if d := time.Since(start); d > closeTimeout+5*time.Second {
		t.Fatalf("Close took %v with a CloseTimeout of %v", d, closeTimeout)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a commit that never ran was reported written")
		}
	default:
		t.Fatal("Close returned before the commit's callback was told")
	}
}

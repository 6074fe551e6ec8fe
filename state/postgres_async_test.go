package state

import (
	"context"
	"testing"
	"time"

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

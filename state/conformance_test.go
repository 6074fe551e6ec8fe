package state

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"kernelgate/internal/pgtest"
)

// storeFactory opens a new, empty store of one kind for t.
type storeFactory struct {
	name string
	open func(t *testing.T) Store
	// reopen, when set, opens a store again on what the last open of
	// this factory wrote (after it was closed).
	reopen func(t *testing.T) Store
}

// storeFactories are every Store implementation, each test's own.
// PostgreSQL's is a private server started for the test that asks for
// it (needs.Skip without PostgreSQL).
func storeFactories() []storeFactory {
	var boltPath string
	return []storeFactory{
		{name: "memory", open: func(*testing.T) Store { return NewMemory() }},
		{name: "bolt",
			open: func(t *testing.T) Store {
				boltPath = filepath.Join(t.TempDir(), FileName)
				return openBolt(t, boltPath, nil)
			},
			reopen: func(t *testing.T) Store { return openBolt(t, boltPath, nil) }},
		pgFactory("postgres", PostgresOptions{}),
		pgFactory("postgres-replica", PostgresOptions{Replica: "r1"}),
	}
}

// pgFactory opens stores of opts, each on a new database of a private
// server started for the first test that asks for one (it stops with
// that test).
func pgFactory(name string, opts PostgresOptions) storeFactory {
	var pg *pgtest.TB
	var pgURL string
	var pgOnce sync.Once
	n := 0
	return storeFactory{name: name,
		open: func(t *testing.T) Store {
			pgOnce.Do(func() { pg = pgtest.Start(t) })
			n++
			pgURL = pg.CreateDB(fmt.Sprintf("conformance%d", n))
			return openPG(t, pgURL, opts)
		},
		reopen: func(t *testing.T) Store { return openPG(t, pgURL, opts) }}
}

func openPG(t testing.TB, url string, opts PostgresOptions) *Postgres {
	t.Helper()
	p, err := OpenPostgres(context.Background(), url, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestStoreConformance: every method of every store, and what a store
// that keeps its records holds after it is closed and opened again.
func TestStoreConformance(t *testing.T) {
	for _, f := range storeFactories() {
		t.Run(f.name, func(t *testing.T) {
			ctx := context.Background()
			s := f.open(t)
			defer func() { s.Close() }()
			ok := func(err error) { t.Helper(); must(t, err) }
			ok(s.PutKernel(ctx, sampleKernel("k1")))
			ok(s.PutContext(ctx, sampleContext("c1")))
			ok(s.PutContext(ctx, sampleContext("c2")))
			ok(s.DeleteContext(ctx, "c2"))
			ok(s.DeleteContext(ctx, "never"))
			ok(s.PutSession(ctx, Session{ID: "s1", KernelID: "k1", Created: t0}))
			ok(s.PutSandbox(ctx, sampleSandbox("sb1")))
			for _, err := range []error{
				s.PutContext(ctx, Context{}), s.PutSession(ctx, Session{}), s.PutSandbox(ctx, Sandbox{}),
				s.PutRun("", nil), s.AppendRunEvents(""), s.CommitRun(ctx, "", nil),
			} {
				if !errors.Is(err, ErrInvalid) {
					t.Errorf("a record without id: %v, want ErrInvalid", err)
				}
			}
			// Queued writes, then a CommitRun: it commits them with it.
			ok(s.PutRun("q1", []byte("queued")))
			ok(s.AppendRunEvents("q1", Event{1, []byte("e1")}, Event{1, []byte("e1 again")}))
			ok(s.CommitRun(ctx, "c", []byte("committed")))
			ok(s.AppendRunEvents("c", Event{7, []byte{0, 1, 2, 255}}))
			ok(s.Flush(ctx))
			want := &Snapshot{
				Kernels:   []Kernel{sampleKernel("k1")},
				Contexts:  []Context{sampleContext("c1")},
				Sessions:  []Session{{ID: "s1", KernelID: "k1", Created: t0}},
				Sandboxes: []Sandbox{sampleSandbox("sb1")},
				Runs: []Run{{ID: "c", Data: []byte("committed"), Events: []Event{{7, []byte{0, 1, 2, 255}}}},
					{ID: "q1", Data: []byte("queued"), Events: []Event{{1, []byte("e1 again")}}}},
			}
			snap, err := s.Load(ctx)
			ok(err)
			if !reflect.DeepEqual(snap, want) {
				t.Errorf("loaded\n%+v\nwant\n%+v", snap, want)
			}
			// A write after Load is no worse for it; Close flushes it.
			ok(s.PutRun("late", []byte("after load")))
			ok(s.Close())
			if err := s.PutRun("x", nil); !errors.Is(err, ErrClosed) {
				t.Errorf("PutRun after close: %v, want ErrClosed", err)
			}
			if err := s.Flush(ctx); !errors.Is(err, ErrClosed) {
				t.Errorf("Flush after close: %v, want ErrClosed", err)
			}
			ok(s.Close()) // twice is no error
			if f.reopen == nil {
				return
			}
			s = f.reopen(t)
			snap, err = s.Load(ctx)
			ok(err)
			want.Runs = []Run{want.Runs[0], {ID: "late", Data: []byte("after load")}, want.Runs[1]}
			if !reflect.DeepEqual(snap, want) {
				t.Errorf("after reopening\n%+v\nwant\n%+v", snap, want)
			}
		})
	}
}

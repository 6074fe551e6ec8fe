package state

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"kernelgate/internal/leakcheck"
	"kernelgate/internal/needs"
)

// logBuffer collects a store's log for a test to read.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func openBolt(t testing.TB, path string, logs *logBuffer) *Bolt {
	t.Helper()
	opts := Options{}
	if logs != nil {
		opts.Logger = slog.New(slog.NewTextHandler(logs, nil))
	}
	b, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var t0 = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

func sampleKernel(id string) Kernel {
	return Kernel{ID: id, Spec: "python3", Provisioner: "local",
		ProvisionerInfo: []byte(`{"pid":123,"startTime":456,"connection":{"key":"k"}}`),
		Cwd:             "/work", EnvNames: []string{"KERNEL_X"}, Created: t0, LastActivity: t0.Add(time.Minute)}
}

func sampleContext(id string) Context {
	return Context{ID: id, Language: "python", Cwd: "/w", Env: map[string]string{"A": "1"}, KernelID: "k1",
		Tokens: []TokenHash{{Hash: [32]byte{1, 2, 3}, Expires: t0.Add(time.Hour)}}, Created: t0}
}

func sampleSandbox(id string) Sandbox {
	return Sandbox{ID: id, Template: "code-interpreter-v1", Metadata: map[string]string{"user": "a"},
		TokenHashes: [][32]byte{{4, 5, 6}}, Started: t0, Ends: t0.Add(5 * time.Minute)}
}

// TestStores runs the same story on every store (storeFactories): records put, replaced,
// deleted; run data and events in seq order; a deleted run goes with its
// events.
func TestStores(t *testing.T) {
	for _, tc := range storeFactories() {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := tc.open(t)
			defer s.Close()
			must(t, s.PutKernel(ctx, sampleKernel("k1")))
			must(t, s.PutKernel(ctx, sampleKernel("k2")))
			k2 := sampleKernel("k2")
			k2.Cwd = "/elsewhere"
			must(t, s.PutKernel(ctx, k2))
			must(t, s.DeleteKernel(ctx, "k1"))
			must(t, s.DeleteKernel(ctx, "absent"))
			must(t, s.PutContext(ctx, sampleContext("c1")))
			must(t, s.PutSession(ctx, Session{ID: "s1", Path: "a.ipynb", Name: "a", Type: "notebook", KernelID: "k2", Created: t0}))
			must(t, s.PutSession(ctx, Session{ID: "s2", KernelID: "k2", Created: t0}))
			must(t, s.DeleteSession(ctx, "s2"))
			must(t, s.PutSandbox(ctx, sampleSandbox("sb1")))
			must(t, s.PutSandbox(ctx, sampleSandbox("sb2")))
			must(t, s.DeleteSandbox(ctx, "sb2"))
			must(t, s.PutRun("r1", []byte(`{"state":"running"}`)))
			must(t, s.AppendRunEvents("r1", Event{2, []byte("b")}, Event{1, []byte("a")}))
			must(t, s.AppendRunEvents("r1", Event{3, []byte("c")}))
			must(t, s.PutRun("r1", []byte(`{"state":"done"}`)))
			must(t, s.PutRun("r2", []byte(`x`)))
			must(t, s.AppendRunEvents("r2", Event{1, []byte("x")}))
			must(t, s.DeleteRun("r2"))
			// Written again after its deletion, in the same commit.
			must(t, s.AppendRunEvents("r3", Event{1, []byte("gone")}))
			must(t, s.PutRun("r3", []byte(`old`)))
			must(t, s.DeleteRun("r3"))
			must(t, s.PutRun("r3", []byte(`new`)))
			must(t, s.AppendRunEvents("r3", Event{2, []byte("kept")}))
			if err := s.PutKernel(ctx, Kernel{}); !errors.Is(err, ErrInvalid) {
				t.Errorf("a kernel without id: %v, want ErrInvalid", err)
			}
			snap, err := s.Load(ctx)
			must(t, err)
			want := &Snapshot{
				Kernels:   []Kernel{k2},
				Contexts:  []Context{sampleContext("c1")},
				Sessions:  []Session{{ID: "s1", Path: "a.ipynb", Name: "a", Type: "notebook", KernelID: "k2", Created: t0}},
				Sandboxes: []Sandbox{sampleSandbox("sb1")},
				Runs: []Run{{ID: "r1", Data: []byte(`{"state":"done"}`), Events: []Event{{1, []byte("a")}, {2, []byte("b")}, {3, []byte("c")}}},
					{ID: "r3", Data: []byte(`new`), Events: []Event{{2, []byte("kept")}}}},
			}
			if !reflect.DeepEqual(snap, want) {
				t.Errorf("loaded\n%+v\nwant\n%+v", snap, want)
			}
			must(t, s.Close())
			if err := s.PutKernel(ctx, k2); !errors.Is(err, ErrClosed) {
				t.Errorf("put after close: %v, want ErrClosed", err)
			}
		})
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestBoltReopen: what was written is there after the file is closed and
// opened again, and the writer leaks nothing.
func TestBoltReopen(t *testing.T) {
	before := leakcheck.Snapshot(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), FileName)
	b := openBolt(t, path, nil)
	must(t, b.PutKernel(ctx, sampleKernel("k1")))
	must(t, b.PutContext(ctx, sampleContext("c1")))
	for i := range 100 {
		id := fmt.Sprintf("r%03d", i)
		must(t, b.PutRun(id, []byte(id)))
		must(t, b.AppendRunEvents(id, Event{1, []byte("e")}))
	}
	must(t, b.Close()) // flushes the queued runs
	b = openBolt(t, path, nil)
	snap, err := b.Load(ctx)
	must(t, err)
	if len(snap.Kernels) != 1 || len(snap.Contexts) != 1 || len(snap.Runs) != 100 || len(snap.Runs[99].Events) != 1 {
		t.Errorf("after reopening: %d kernels, %d contexts, %d runs", len(snap.Kernels), len(snap.Contexts), len(snap.Runs))
	}
	if !reflect.DeepEqual(snap.Kernels[0], sampleKernel("k1")) {
		t.Errorf("kernel %+v", snap.Kernels[0])
	}
	must(t, b.Close())
	leakcheck.Check(t, before)
}

// writeStore makes a store at path holding a few records and closes it.
func writeStore(t *testing.T, path string) {
	t.Helper()
	b := openBolt(t, path, nil)
	ctx := context.Background()
	for i := range 3 {
		must(t, b.PutKernel(ctx, sampleKernel(fmt.Sprint("k", i))))
	}
	for i := range 200 {
		must(t, b.PutRun(fmt.Sprint("r", i), bytes.Repeat([]byte("x"), 3000)))
	}
	must(t, b.Close())
}

// TestBoltUnusableFile: a file that is not a store, a torn one, one with
// a damaged page, one without a schema and one of a newer schema never
// stop Open: the file is moved aside under a name with the time, the log
// says what was lost, and a new empty store works.
func TestBoltUnusableFile(t *testing.T) {
	cases := []struct {
		name   string
		make   func(t *testing.T, path string)
		suffix string
		lost   string // in the log
	}{
		{"garbage", func(t *testing.T, path string) {
			must(t, os.WriteFile(path, bytes.Repeat([]byte("not a database "), 1000), 0o600))
		}, "damaged", "unreadable"},
		{"torn", func(t *testing.T, path string) {
			writeStore(t, path)
			fi, err := os.Stat(path)
			must(t, err)
			must(t, os.Truncate(path, fi.Size()/3))
		}, "damaged", "unreadable"},
		{"too short", func(t *testing.T, path string) {
			writeStore(t, path)
			must(t, os.Truncate(path, 100))
		}, "damaged", "unreadable"},
		{"scribbled page", func(t *testing.T, path string) {
			writeStore(t, path)
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			must(t, err)
			defer f.Close()
			fi, _ := f.Stat()
			// Every page after the two meta pages and the freelist.
			junk := bytes.Repeat([]byte{0xff}, int(fi.Size())-4*4096)
			_, err = f.WriteAt(junk, 4*4096)
			must(t, err)
		}, "damaged", ""},
		{"no schema", func(t *testing.T, path string) {
			db, err := bolt.Open(path, 0o600, nil)
			must(t, err)
			must(t, db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("other")); return err }))
			must(t, db.Close())
		}, "damaged", "0 kernels"},
		{"newer schema", func(t *testing.T, path string) {
			writeStore(t, path)
			db, err := bolt.Open(path, 0o600, nil)
			must(t, err)
			must(t, db.Update(func(tx *bolt.Tx) error {
				return tx.Bucket(bucketMeta).Put(keySchema, binary.BigEndian.AppendUint64(nil, SchemaVersion+1))
			}))
			must(t, db.Close())
		}, "newer", "3 kernels, 0 contexts, 0 sessions, 200 runs"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, FileName)
			tc.make(t, path)
			old, err := os.ReadFile(path)
			must(t, err)
			var logs logBuffer
			b := openBolt(t, path, &logs)
			defer b.Close()
			snap, err := b.Load(context.Background())
			must(t, err)
			if len(snap.Kernels)+len(snap.Runs) != 0 {
				t.Errorf("the new store is not empty: %+v", snap)
			}
			must(t, b.PutKernel(context.Background(), sampleKernel("new")))
			aside, _ := filepath.Glob(filepath.Join(dir, FileName+".*."+tc.suffix))
			if len(aside) != 1 {
				entries, _ := os.ReadDir(dir)
				t.Fatalf("moved-aside files %v; the directory holds %v", aside, entries)
			}
			kept, err := os.ReadFile(aside[0])
			must(t, err)
			if !bytes.Equal(kept, old) {
				t.Error("the file moved aside is not the old file")
			}
			log := logs.String()
			if !strings.Contains(log, "moved aside") || !strings.Contains(log, filepath.Base(aside[0])) || !strings.Contains(log, tc.lost) {
				t.Errorf("log does not say what was moved where and what was lost (%q):\n%s", tc.lost, log)
			}
			if fi, err := os.Stat(aside[0]); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("moved-aside file mode: %v %v", fi.Mode(), err)
			}
		})
	}
}

// TestBoltLocked: a file another live store holds makes Open fail with
// ErrLocked within its lock timeout; the file is neither moved nor
// changed.
func TestBoltLocked(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	first := openBolt(t, path, nil)
	defer first.Close()
	must(t, first.PutKernel(context.Background(), sampleKernel("k1")))
	_, err := Open(path, Options{LockTimeout: 100 * time.Millisecond})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "another kernelgate") {
		t.Fatalf("second open: %v, want ErrLocked saying why", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the directory holds %v", entries)
	}
	snap, err := first.Load(context.Background())
	must(t, err)
	if len(snap.Kernels) != 1 {
		t.Errorf("the first store lost its kernel: %+v", snap)
	}
}

// TestBoltPermissions: the directory is made 0700 and the file 0600,
// wider modes of existing ones are fixed, and what cannot be made private
// is refused.
func TestBoltPermissions(t *testing.T) {
	t.Run("new", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "a", "kernelgate")
		b := openBolt(t, filepath.Join(dir, FileName), nil)
		defer b.Close()
		checkMode(t, dir, 0o700)
		checkMode(t, filepath.Join(dir, FileName), 0o600)
	})
	t.Run("fixed", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "kernelgate")
		must(t, os.Mkdir(dir, 0o755))
		must(t, os.Chmod(dir, 0o777))
		path := filepath.Join(dir, FileName)
		writeStore(t, path)
		must(t, os.Chmod(path, 0o644))
		var logs logBuffer
		b := openBolt(t, path, &logs)
		defer b.Close()
		checkMode(t, dir, 0o700)
		checkMode(t, path, 0o600)
		if !strings.Contains(logs.String(), "made private") {
			t.Errorf("the fix is not logged:\n%s", logs.String())
		}
		if snap, _ := b.Load(context.Background()); len(snap.Kernels) != 3 {
			t.Errorf("fixing modes lost records: %d kernels", len(snap.Kernels))
		}
	})
	t.Run("sticky", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "shared")
		must(t, os.Mkdir(dir, 0o700))
		must(t, os.Chmod(dir, 0o777|os.ModeSticky))
		if _, err := Open(filepath.Join(dir, FileName), Options{}); !errors.Is(err, ErrUnsafe) {
			t.Errorf("a sticky shared directory: %v, want ErrUnsafe", err)
		}
	})
	t.Run("symlink", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(dir, "elsewhere.db")
		must(t, os.WriteFile(target, nil, 0o600))
		must(t, os.Symlink(target, filepath.Join(dir, FileName)))
		if _, err := Open(filepath.Join(dir, FileName), Options{}); !errors.Is(err, ErrUnsafe) {
			t.Errorf("a symbolic link: %v, want ErrUnsafe", err)
		}
	})
	t.Run("other owner", func(t *testing.T) {
		if os.Geteuid() != 0 {
			needs.Skip(t, "giving a directory to another user needs root; the test runs as uid %d", os.Geteuid())
		}
		dir := filepath.Join(t.TempDir(), "kernelgate")
		must(t, os.Mkdir(dir, 0o700))
		must(t, os.Chown(dir, 65534, 65534))
		_, err := Open(filepath.Join(dir, FileName), Options{})
		if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "uid 65534") {
			t.Errorf("a directory of another user: %v, want ErrUnsafe naming its owner", err)
		}
	})
}

func checkMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	must(t, err)
	if fi.Mode().Perm() != want {
		t.Errorf("%s has mode %v, want %v", path, fi.Mode().Perm(), want)
	}
}

func TestResolveDir(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	cwd, _ := os.Getwd()
	for _, tc := range []struct {
		name string
		dir  string
		set  bool
		env  map[string]string
		want string
	}{
		{"xdg", "", false, map[string]string{"XDG_STATE_HOME": "/x/state", "HOME": "/home/u"}, "/x/state/kernelgate"},
		{"home", "", false, map[string]string{"HOME": "/home/u"}, "/home/u/.local/state/kernelgate"},
		{"relative xdg ignored", "", false, map[string]string{"XDG_STATE_HOME": "rel", "HOME": "/home/u"}, "/home/u/.local/state/kernelgate"},
		{"memory", "", true, map[string]string{"HOME": "/home/u"}, ""},
		{"given", "/srv/kg", true, map[string]string{"HOME": "/home/u"}, "/srv/kg"},
		{"relative", "st", true, nil, filepath.Join(cwd, "st")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResolveDir(tc.dir, tc.set, env(tc.env))
			if err != nil || got != tc.want {
				t.Errorf("ResolveDir(%q, %v) = %q, %v; want %q", tc.dir, tc.set, got, err, tc.want)
			}
		})
	}
}

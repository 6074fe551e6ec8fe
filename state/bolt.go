package state

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"kernelgate/internal/flock"
)

// SchemaVersion is the layout of the store file this kernelgate writes.
// A file of a newer version is moved aside, never read or changed.
const SchemaVersion = 1

// Defaults of Options.
const (
	DefaultFlushDelay  = 20 * time.Millisecond
	DefaultMaxQueued   = 64 << 20
	DefaultLockTimeout = 2 * time.Second
)

// Buckets of the file: meta holds "schema"; kernels, contexts, sessions
// and sandboxes map an id to its record in JSON; runs maps a run id to its
// data; events holds one bucket per run, seq (8 bytes, big-endian) to
// event.
var (
	bucketMeta      = []byte("meta")
	bucketKernels   = []byte("kernels")
	bucketContexts  = []byte("contexts")
	bucketSessions  = []byte("sessions")
	bucketSandboxes = []byte("sandboxes")
	bucketRuns      = []byte("runs")
	bucketEvents    = []byte("events")
	keySchema       = []byte("schema")
	allBuckets      = [][]byte{bucketMeta, bucketKernels, bucketContexts, bucketSessions, bucketSandboxes, bucketRuns, bucketEvents}
)

// Options tune a Bolt store; zero values take the defaults.
type Options struct {
	Logger *slog.Logger
	// FlushDelay bounds how long a queued run write waits before it is
	// committed: what a crash can lose of the runs.
	FlushDelay time.Duration
	// MaxQueued bounds the bytes of run writes waiting for their commit;
	// beyond it PutRun and AppendRunEvents refuse the write with ErrBusy
	// rather than wait for the disk.
	MaxQueued int
	// LockTimeout is how long Open waits for the file's lock, which
	// another live kernelgate may hold.
	LockTimeout time.Duration
	// BeforeCommit, when set, is called by the writer with the bytes of
	// each batch before it commits it. Tests hold it to play a disk that
	// does not answer; nil otherwise.
	BeforeCommit func(bytes int)
}

func (o *Options) defaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.FlushDelay <= 0 {
		o.FlushDelay = DefaultFlushDelay
	}
	if o.MaxQueued <= 0 {
		o.MaxQueued = DefaultMaxQueued
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = DefaultLockTimeout
	}
}

// Bolt is the Store of one file (FileName in the state directory) in
// bbolt. One goroutine writes: every write goes through its queue
// (writeQueue), in call order. A durable write (a kernel, context,
// session, CommitRun, CommitRunAsync or Flush) is committed at once, with
// whatever is queued before it; run writes wait up to FlushDelay for
// company. Each commit is one bbolt transaction and one fsync, and
// durable writes that come while one is being committed share the next
// (group commit).
type Bolt struct {
	writeQueue
	db   *bolt.DB
	path string
}

var _ Store = (*Bolt)(nil)

// Open opens the store file at path (made 0600 in a 0700 directory).
// A file that cannot be used (not a bbolt file, torn, corrupt, or of a
// newer schema) is renamed aside with the time and why in its name, what
// it held is logged, and a new store starts. A file another process holds
// fails with ErrLocked after Options.LockTimeout.
func Open(path string, opts Options) (*Bolt, error) {
	opts.defaults()
	log := opts.Logger
	if err := prepare(log, path); err != nil {
		return nil, err
	}
	db, err := openChecked(path, opts)
	var bad *unusableError
	if errors.As(err, &bad) {
		aside, merr := moveAside(path, bad.suffix)
		if merr != nil {
			return nil, fmt.Errorf("state: %s cannot be used (%v) nor moved aside: %w", path, bad, merr)
		}
		log.Error("state: the store could not be used; it was moved aside and a new one starts, so what it held is not restored",
			"path", path, "movedTo", aside, "why", bad.Error(), "lost", describe(aside))
		db, err = openChecked(path, opts)
	}
	if err != nil {
		return nil, err
	}
	// A new file's name is durable only once its directory is synced.
	syncDir(filepath.Dir(path))
	b := &Bolt{db: db, path: path}
	b.writeQueue = newWriteQueue(opts, b.commit)
	go b.writer()
	return b, nil
}

// Path is the store file.
func (b *Bolt) Path() string { return b.path }

// unusableError says why a store file cannot be used.
type unusableError struct {
	suffix string // "damaged" or "newer": part of the name it is moved to
	why    string
}

func (e *unusableError) Error() string { return e.why }

// openChecked opens the file and reads all of it, so that damage shows
// now rather than in the middle of a write. bbolt maps the file: a read
// past the end of a truncated one faults, which is turned into a panic of
// this goroutine and recovered, as are bbolt's own panics on bad pages.
func openChecked(path string, o Options) (db *bolt.DB, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if db != nil {
				closeQuietly(db)
			}
			db, err = nil, &unusableError{"damaged", fmt.Sprintf("reading it failed: %v", r)}
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: o.LockTimeout})
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		holder := ""
		if f, err := os.Open(path); err == nil {
			if pids := lockHolders(f, os.Getpid()); len(pids) > 0 && pids[0] > 0 {
				holder = fmt.Sprintf(" by process %d", pids[0])
			}
			f.Close()
		}
		return nil, fmt.Errorf("%w: %s is locked%s (waited %v): is another kernelgate running with this state directory?", ErrLocked, path, holder, o.LockTimeout)
	case err != nil:
		return nil, &unusableError{"damaged", fmt.Sprintf("not a readable store: %v", err)}
	}
	var version uint64
	err = db.View(func(tx *bolt.Tx) error {
		if meta := tx.Bucket(bucketMeta); meta != nil {
			if v := meta.Get(keySchema); len(v) == 8 {
				version = binary.BigEndian.Uint64(v)
			}
		}
		empty := true
		if err := tx.ForEach(func(name []byte, bk *bolt.Bucket) error {
			empty = false
			return walk(bk)
		}); err != nil {
			return err
		}
		switch {
		case version > SchemaVersion:
			return &unusableError{"newer", fmt.Sprintf("written by a newer kernelgate (store schema %d; this one knows %d)", version, SchemaVersion)}
		case version == 0 && !empty:
			return &unusableError{"damaged", "no schema version: not a kernelgate store"}
		}
		return nil
	})
	if err == nil {
		err = db.Update(func(tx *bolt.Tx) error {
			for _, name := range allBuckets {
				if _, err := tx.CreateBucketIfNotExists(name); err != nil {
					return err
				}
			}
			v := binary.BigEndian.AppendUint64(nil, SchemaVersion)
			return tx.Bucket(bucketMeta).Put(keySchema, v)
		})
	}
	if err != nil {
		closeQuietly(db)
		var bad *unusableError
		if errors.As(err, &bad) {
			return nil, err
		}
		return nil, &unusableError{"damaged", err.Error()}
	}
	return db, nil
}

// walk reads every key and value of bk and the buckets in it.
func walk(bk *bolt.Bucket) error {
	return bk.ForEach(func(k, v []byte) error {
		if v == nil {
			if sub := bk.Bucket(k); sub != nil {
				return walk(sub)
			}
			return nil
		}
		touch(v)
		return nil
	})
}

// touched keeps touch from being optimised away.
var touched byte

// touch reads every page of v (a large value lies on overflow pages that
// a walk of the keys never reads).
func touch(v []byte) {
	var x byte
	for i := 0; i < len(v); i += 1024 {
		x ^= v[i]
	}
	if len(v) > 0 {
		x ^= v[len(v)-1]
	}
	touched ^= x
}

func closeQuietly(db *bolt.DB) {
	defer func() { recover() }()
	db.Close()
}

// moveAside renames a store file that cannot be used to
// <path>.<UTC time>.<suffix>, unless another process holds it.
func moveAside(path, suffix string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if held, err := flock.TryLock(f); err != nil {
		return "", err
	} else if held {
		// bbolt's Open may panic on a damaged file with the file still
		// open and locked by this process: that lock is no one else's.
		if others := lockHolders(f, os.Getpid()); len(others) > 0 {
			return "", fmt.Errorf("%w: %s is locked by process %v", ErrLocked, path, others)
		}
	}
	base := path + "." + time.Now().UTC().Format("20060102T150405Z")
	aside := base + "." + suffix
	for i := 2; ; i++ {
		if _, err := os.Lstat(aside); errors.Is(err, os.ErrNotExist) {
			break
		}
		aside = fmt.Sprintf("%s-%d.%s", base, i, suffix)
	}
	if err := os.Rename(path, aside); err != nil {
		return "", err
	}
	syncDir(filepath.Dir(path))
	return aside, nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// describe says, as far as it can still be read, what a moved-aside
// store held.
func describe(path string) (out string) {
	size := int64(-1)
	if fi, err := os.Stat(path); err == nil {
		size = fi.Size()
	}
	unreadable := fmt.Sprintf("everything it held (%d bytes, unreadable)", size)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			out = unreadable
		}
	}()
	// A short wait: a damaged file may still be locked by this process,
	// whose bbolt panicked while opening it.
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 50 * time.Millisecond})
	if err != nil {
		return unreadable
	}
	defer closeQuietly(db)
	var parts []string
	err = db.View(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketKernels, bucketContexts, bucketSessions, bucketRuns, bucketSandboxes} {
			n := 0
			if bk := tx.Bucket(name); bk != nil {
				n = bk.Stats().KeyN
			}
			parts = append(parts, fmt.Sprintf("%d %s", n, name))
		}
		return nil
	})
	if err != nil {
		return unreadable
	}
	return strings.Join(parts, ", ")
}

// commit writes batch in one transaction.
func (b *Bolt) commit(batch []op) error {
	return b.db.Update(func(tx *bolt.Tx) error {
		events := tx.Bucket(bucketEvents)
		for _, o := range batch {
			var err error
			key := []byte(o.key)
			switch o.kind {
			case opPut:
				err = tx.Bucket(o.bucket).Put(key, o.val)
			case opDelete:
				err = tx.Bucket(o.bucket).Delete(key)
			case opPutRun:
				err = tx.Bucket(bucketRuns).Put(key, o.val)
			case opEvents:
				var bk *bolt.Bucket
				if bk, err = events.CreateBucketIfNotExists(key); err != nil {
					break
				}
				for _, e := range o.events {
					if err = bk.Put(binary.BigEndian.AppendUint64(nil, e.Seq), e.Data); err != nil {
						break
					}
				}
			case opDeleteRun:
				if err = tx.Bucket(bucketRuns).Delete(key); err == nil {
					if err = events.DeleteBucket(key); errors.Is(err, berrors.ErrBucketNotFound) {
						err = nil
					}
				}
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

func (b *Bolt) Load(ctx context.Context) (*Snapshot, error) {
	if err := b.Flush(ctx); err != nil {
		return nil, err
	}
	snap := &Snapshot{}
	err := b.db.View(func(tx *bolt.Tx) error {
		decodeAll(b.log, tx, bucketKernels, &snap.Kernels)
		decodeAll(b.log, tx, bucketContexts, &snap.Contexts)
		decodeAll(b.log, tx, bucketSessions, &snap.Sessions)
		decodeAll(b.log, tx, bucketSandboxes, &snap.Sandboxes)
		events := tx.Bucket(bucketEvents)
		runs := map[string]int{}
		tx.Bucket(bucketRuns).ForEach(func(k, v []byte) error {
			runs[string(k)] = len(snap.Runs)
			snap.Runs = append(snap.Runs, Run{ID: string(k), Data: clone(v)})
			return nil
		})
		// Events of a run whose data was never written still make a run.
		return events.ForEach(func(k, _ []byte) error {
			i, ok := runs[string(k)]
			if !ok {
				i = len(snap.Runs)
				snap.Runs = append(snap.Runs, Run{ID: string(k)})
			}
			return events.Bucket(k).ForEach(func(seq, v []byte) error {
				if len(seq) == 8 {
					snap.Runs[i].Events = append(snap.Runs[i].Events, Event{Seq: binary.BigEndian.Uint64(seq), Data: clone(v)})
				}
				return nil
			})
		})
	})
	if err != nil {
		return nil, err
	}
	snap.sort()
	return snap, nil
}

// decodeAll appends every record of bucket name to out; one that does
// not decode is logged and left out.
func decodeAll[T any](log *slog.Logger, tx *bolt.Tx, name []byte, out *[]T) {
	tx.Bucket(name).ForEach(func(k, v []byte) error {
		var r T
		if err := json.Unmarshal(v, &r); err != nil {
			log.Error("state: a record does not decode and is not restored", "bucket", string(name), "id", string(k), "err", err)
			return nil
		}
		*out = append(*out, r)
		return nil
	})
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

// Close commits what is queued and closes the file.
func (b *Bolt) Close() error {
	if !b.closeQueue() {
		return nil
	}
	return b.db.Close()
}

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
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
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
// bbolt. One goroutine writes: every write goes through its queue, in
// call order. A durable write (a kernel, context, session, CommitRun,
// CommitRunAsync or Flush) is committed at once, with whatever is queued before it; run
// writes wait up to FlushDelay for company. Each commit is one bbolt
// transaction and one fsync, and durable writes that come while one is
// being committed share the next (group commit).
type Bolt struct {
	db   *bolt.DB
	path string
	log  *slog.Logger
	opts Options

	mu      sync.Mutex
	queue   []op
	queued  int  // bytes in queue
	urgent  bool // a durable write or Flush waits in queue
	closed  bool
	wake    chan struct{} // cap 1: the queue changed
	stopped chan struct{} // closed when the writer has ended
}

var _ Store = (*Bolt)(nil)

type opKind uint8

const (
	opPut opKind = iota
	opDelete
	opPutRun
	opEvents
	opDeleteRun
	opBarrier // Flush: nothing to write
)

type op struct {
	kind   opKind
	bucket []byte
	key    string
	val    []byte
	events []Event
	ack    chan error // durable writes and Flush; nil for run writes
	// done, instead of ack, is told the commit's outcome (CommitRunAsync):
	// called by the writer, it never blocks.
	done func(error)
}

// durable says the op is committed at once and acknowledged: never
// refused for a full queue.
func (o *op) durable() bool { return o.ack != nil || o.done != nil }

func (o *op) size() int {
	n := len(o.key) + len(o.val) + 64
	for _, e := range o.events {
		n += len(e.Data) + 16
	}
	return n
}

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
	b := &Bolt{db: db, path: path, log: log, opts: opts,
		wake: make(chan struct{}, 1), stopped: make(chan struct{})}
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
	if held, err := tryLock(f); err != nil {
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

// enqueue adds o to the queue. It never waits: a run write (but a
// delete, which is small) that would take the queue over its bound is
// refused with ErrBusy, so that a disk that does not answer never holds
// up the caller (a kernel's reader).
func (b *Bolt) enqueue(o op) error {
	size := o.size()
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	if !o.durable() && o.kind != opDeleteRun && b.queued > 0 && b.queued+size > b.opts.MaxQueued {
		b.mu.Unlock()
		return ErrBusy
	}
	// The writer needs waking only when it sleeps on an empty queue, or
	// to commit at once: a run write joining others already queued waits
	// for their commit without a switch to the writer.
	wake := len(b.queue) == 0 || o.durable()
	b.queue = append(b.queue, o)
	b.queued += size
	b.urgent = b.urgent || o.durable()
	wake = wake || b.full()
	b.mu.Unlock()
	if wake {
		select {
		case b.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

// durable enqueues o and waits for its commit.
func (b *Bolt) durable(ctx context.Context, o op) error {
	o.ack = make(chan error, 1)
	if err := b.enqueue(o); err != nil {
		return err
	}
	select {
	case err := <-o.ack:
		return err
	case <-ctx.Done():
		// It is queued and will be committed; the caller stops waiting.
		return ctx.Err()
	}
}

// writer is the one goroutine that writes to the file.
func (b *Bolt) writer() {
	defer close(b.stopped)
	var timer *time.Timer
	for {
		b.mu.Lock()
		n, urgent, closed := len(b.queue), b.urgent || b.full(), b.closed
		b.mu.Unlock()
		switch {
		case n == 0 && closed:
			return
		case n == 0:
			<-b.wake
			continue
		case !urgent && !closed:
			// Run writes only: give others FlushDelay to join them,
			// unless a durable write arrives first.
			if timer == nil {
				timer = time.NewTimer(b.opts.FlushDelay)
			} else {
				timer.Reset(b.opts.FlushDelay)
			}
		wait:
			for {
				select {
				case <-timer.C:
					break wait
				case <-b.wake:
					b.mu.Lock()
					u, c := b.urgent || b.full(), b.closed
					b.mu.Unlock()
					if u || c {
						timer.Stop()
						break wait
					}
				}
			}
		}
		b.mu.Lock()
		batch, bytes := b.queue, b.queued
		b.queue, b.queued, b.urgent = nil, 0, false
		b.mu.Unlock()
		if b.opts.BeforeCommit != nil {
			b.opts.BeforeCommit(bytes)
		}
		err := b.commit(batch)
		lost := 0
		for _, o := range batch {
			switch {
			case o.ack != nil:
				o.ack <- err
			case o.done != nil:
				o.done(err)
			case o.kind != opBarrier:
				lost++
			}
		}
		if err != nil && lost > 0 {
			b.log.Error("state: run records were not written", "count", lost, "err", err)
		}
	}
}

// full says the queue is half its bound: worth a commit without waiting.
// The caller holds b.mu.
func (b *Bolt) full() bool { return b.queued >= b.opts.MaxQueued/2 }

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

func (b *Bolt) putRecord(ctx context.Context, bucket []byte, id string, v any) error {
	if id == "" {
		return ErrInvalid
	}
	val, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.durable(ctx, op{kind: opPut, bucket: bucket, key: id, val: val})
}

func (b *Bolt) deleteRecord(ctx context.Context, bucket []byte, id string) error {
	return b.durable(ctx, op{kind: opDelete, bucket: bucket, key: id})
}

func (b *Bolt) PutKernel(ctx context.Context, k Kernel) error {
	return b.putRecord(ctx, bucketKernels, k.ID, k)
}
func (b *Bolt) DeleteKernel(ctx context.Context, id string) error {
	return b.deleteRecord(ctx, bucketKernels, id)
}
func (b *Bolt) PutContext(ctx context.Context, c Context) error {
	return b.putRecord(ctx, bucketContexts, c.ID, c)
}
func (b *Bolt) DeleteContext(ctx context.Context, id string) error {
	return b.deleteRecord(ctx, bucketContexts, id)
}
func (b *Bolt) PutSession(ctx context.Context, s Session) error {
	return b.putRecord(ctx, bucketSessions, s.ID, s)
}
func (b *Bolt) DeleteSession(ctx context.Context, id string) error {
	return b.deleteRecord(ctx, bucketSessions, id)
}
func (b *Bolt) PutSandbox(ctx context.Context, s Sandbox) error {
	return b.putRecord(ctx, bucketSandboxes, s.ID, s)
}
func (b *Bolt) DeleteSandbox(ctx context.Context, id string) error {
	return b.deleteRecord(ctx, bucketSandboxes, id)
}

// PutRun queues the run's data; the caller may reuse data after it
// returns only if it does not change it (it is not copied).
func (b *Bolt) PutRun(id string, data []byte) error {
	if id == "" {
		return ErrInvalid
	}
	return b.enqueue(op{kind: opPutRun, key: id, val: data})
}

// CommitRun is PutRun waited for: it is committed at once, with what is
// queued, and never refused for a full queue.
func (b *Bolt) CommitRun(ctx context.Context, id string, data []byte) error {
	if id == "" {
		return ErrInvalid
	}
	return b.durable(ctx, op{kind: opPutRun, key: id, val: data})
}

// CommitRunAsync is CommitRun not waited for: it is committed at once,
// with what is queued, and never refused for a full queue; the writer
// calls done with the commit's outcome.
func (b *Bolt) CommitRunAsync(id string, data []byte, done func(error)) error {
	if id == "" {
		return ErrInvalid
	}
	return b.enqueue(op{kind: opPutRun, key: id, val: data, done: done})
}

// AppendRunEvents queues the events; their Data is not copied.
func (b *Bolt) AppendRunEvents(id string, events ...Event) error {
	if id == "" {
		return ErrInvalid
	}
	return b.enqueue(op{kind: opEvents, key: id, events: events})
}

func (b *Bolt) DeleteRun(id string) error {
	return b.enqueue(op{kind: opDeleteRun, key: id})
}

func (b *Bolt) Flush(ctx context.Context) error {
	return b.durable(ctx, op{kind: opBarrier})
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
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		<-b.stopped
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
	<-b.stopped
	return b.db.Close()
}

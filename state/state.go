// Package state keeps what kernelgate must not lose when it restarts: its
// kernels (and how to reach them again), contexts, Jupyter sessions, the
// E2B endpoint's sandboxes and run records.
//
// A Store is the one interface the rest of kernelgate sees. Three
// implementations live here: Memory, which keeps everything in this
// process (an empty --state-dir), Bolt, one file under the state directory in
// go.etcd.io/bbolt, and Postgres (--state-url), a PostgreSQL database used
// by one gateway or shared by several replicas. Replicas own kernels
// through leases with fencing epochs (postgres_replicas.go) and make the
// writes about a kernel under its lease (Fenced, fence.go), so that a
// replica that lost the lease cannot write them any more.
//
// Two kinds of write:
//   - Records the API acknowledges (kernels, contexts, sessions and
//     sandboxes, created or deleted) are durable when the call returns: a
//     201 survives a crash right after it.
//   - Run records and their events are written at the rate runs finish
//     (hundreds a second). Those calls only queue the write and return;
//     a writer commits what is queued at most FlushDelay later, one fsync
//     for the lot. A crash loses at most the run writes of that last
//     FlushDelay. Flush waits for them. They never wait for the disk:
//     while too much is queued (a slow or hung disk) they are refused
//     with ErrBusy, and their owner writes them again later.
//   - CommitRun writes a run's record and waits for it, as the durable
//     records: a run whose id is handed out has a record that survives a
//     crash. Commits that come together share one fsync. CommitRunAsync
//     starts the same commit and returns at once: its owner goes on (sends
//     the run's code to its kernel) while the disk works, and learns of
//     the commit from a callback.
//
// The package knows nothing of kernels or HTTP: run data and provisioner
// information are bytes that their owners encode.
package state

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Sentinel errors.
var (
	// ErrLocked: another live process holds the store file.
	ErrLocked = errors.New("state: store is in use by another process")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("state: store is closed")
	// ErrUnsafe: the state directory or file cannot be made private
	// (owned by someone else, not a directory, a symbolic link).
	ErrUnsafe = errors.New("state: state directory is not private")
	// ErrInvalid: a record misses its id.
	ErrInvalid = errors.New("state: invalid record")
	// ErrBusy: a run write was refused, not queued, because the writes
	// queued before it have not reached the disk yet.
	ErrBusy = errors.New("state: store is behind; run write not queued")
)

// Kernel is a kernel kernelgate started.
type Kernel struct {
	ID string `json:"id"`
	// Spec is the kernelspec's name.
	Spec string `json:"spec"`
	// Provisioner names the provisioner that launched it ("local").
	Provisioner string `json:"provisioner"`
	// ProvisionerInfo is what the provisioner needs to reach and control
	// the kernel again, as it serialised it. For a local kernel it holds
	// the connection info with its key, the pid and the process start
	// time (jupyter.ProvisionerInfo).
	ProvisionerInfo json.RawMessage `json:"provisionerInfo,omitempty"`
	Cwd             string          `json:"cwd,omitempty"`
	// EnvNames are the names of the variables the kernel was given (not
	// their values).
	EnvNames     []string  `json:"envNames,omitempty"`
	Created      time.Time `json:"created"`
	LastActivity time.Time `json:"lastActivity,omitzero"`
	// Extra holds the owner's fields this package does not name.
	Extra json.RawMessage `json:"extra,omitempty"`
}

// TokenHash is a context token as kept: its SHA-256 and its expiry.
type TokenHash struct {
	Hash    [32]byte  `json:"hash"`
	Expires time.Time `json:"expires"`
}

// Context is a code-interpreter context.
type Context struct {
	ID       string            `json:"id"`
	Language string            `json:"language"`
	Cwd      string            `json:"cwd,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	// KernelID is the kernel holding its state, "" when it has none.
	KernelID string          `json:"kernelId,omitempty"`
	Tokens   []TokenHash     `json:"tokens,omitempty"`
	Created  time.Time       `json:"created"`
	Extra    json.RawMessage `json:"extra,omitempty"`
}

// Session is a Jupyter session.
type Session struct {
	ID       string          `json:"id"`
	Path     string          `json:"path"`
	Name     string          `json:"name"`
	Type     string          `json:"type"`
	KernelID string          `json:"kernelId"`
	Created  time.Time       `json:"created"`
	Extra    json.RawMessage `json:"extra,omitempty"`
}

// Sandbox is a sandbox of the E2B-compatible endpoint (package e2b). Its
// contexts are kept as contexts, under ids that name the sandbox.
type Sandbox struct {
	ID       string            `json:"id"`
	Template string            `json:"template,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// TokenHashes are the SHA-256 hashes of its access tokens (never the
	// tokens).
	TokenHashes [][32]byte `json:"tokenHashes,omitempty"`
	Started     time.Time  `json:"started"`
	// Ends is when its timeout runs out.
	Ends  time.Time       `json:"ends"`
	Extra json.RawMessage `json:"extra,omitempty"`
}

// Event is one event of a run, as its owner encoded it.
type Event struct {
	Seq  uint64
	Data []byte
}

// Run is a run record: its Execution and state, as its owner encoded
// them, and the events kept within the run limits.
type Run struct {
	ID     string
	Data   []byte
	Events []Event // in Seq order; filled by Load
}

// Snapshot is everything a store holds, as Load returns it.
type Snapshot struct {
	Kernels   []Kernel
	Contexts  []Context
	Sessions  []Session
	Sandboxes []Sandbox
	Runs      []Run
}

// Store keeps kernelgate's records. It is safe for concurrent use.
//
// Its writes (the Writer half):
//   - Put and Delete of kernels, contexts, sessions and sandboxes return
//     once the change is durable. Deleting what is not there is no error.
//   - PutRun replaces a run's data, AppendRunEvents adds events to it
//     (an event of a seq already there replaces it) and DeleteRun removes
//     it with its events. They queue the write and return at once,
//     never waiting for the disk: while more than a bounded amount is
//     queued, PutRun and AppendRunEvents refuse the write with ErrBusy
//     (the caller writes it again once Flush has returned). A queued
//     write is durable within the store's flush delay, and in call order
//     with every other write. The store may hold on to data until it is
//     written: the caller must not change it after the call.
//   - CommitRun is PutRun that returns once the write (and every write
//     queued before it) is durable; it is never refused with ErrBusy.
//   - CommitRunAsync is CommitRun that does not wait: it queues the write
//     to be committed at once and returns; done is called once with the
//     commit's outcome (nil once the write and every write queued before
//     it are durable). When it returns an error (ErrClosed, ErrInvalid)
//     nothing was queued and done is never called. done may be called
//     before CommitRunAsync returns, on the caller's goroutine, or later
//     on the store's writer: it must not block, nor take a lock that is
//     held while calling the store (closing a channel, setting an atomic
//     value, stopping a timer are fine). Until it is called, a commit
//     that does not come is the caller's to time out.
//   - Flush returns once every write queued before it is durable.
//
// Fenced(store, fence) gives the same writes made under a kernel's lease,
// for stores shared by replicas.
type Store interface {
	Writer
	// Load returns every record, runs with their events.
	Load(ctx context.Context) (*Snapshot, error)
	// Close flushes what is queued and releases the store.
	Close() error
}

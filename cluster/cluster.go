// Package cluster makes a gateway one of several replicas on a shared
// store: its membership (a row the others see while it is alive) and the
// leases it holds on kernels, each with a fencing epoch, renewed on a
// ticker and given up when lost.
//
// It knows the store only through the small Store interface below
// (state.Postgres opened as a replica implements it), and nothing of
// kernels, sessions or HTTP: a kernel is its id, and what to do when a
// lease is lost is the owner's callback. The store, not this package,
// refuses a write under a lease no longer held (state.Fenced,
// state.ErrFenced); this package tells the owner early so that it stops
// acting for the kernel.
package cluster

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"kernelgate/state"
)

// DefaultLease is how long a replica's row and its leases live without
// being renewed.
const DefaultLease = 10 * time.Second

// Config is a replica's part in a cluster.
type Config struct {
	// URL is the address other replicas reach this one at
	// (--advertise-url).
	URL string
	// Lease is how long this replica's row and leases live without
	// being renewed (--lease); both are renewed every Lease/3. Zero:
	// DefaultLease; at least MinLease.
	Lease time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

// Flags registers the command line flags of c on fs.
func (c *Config) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.URL, "advertise-url", "", "address the other replicas reach this one at (default: the listen address)")
	fs.DurationVar(&c.Lease, "lease", DefaultLease, "how long a replica's kernels stay its own without a renewal; a replica paused or cut off longer loses them to another")
}

// MinLease is the shortest lease a Config may have: renewals come every
// Lease/3, each a round trip to the database.
const MinLease = 100 * time.Millisecond

// ErrLeaseTooShort: Config.Lease is below MinLease.
var ErrLeaseTooShort = errors.New("cluster: the lease is too short")

// defaults fills in the zero values and checks the rest.
func (c *Config) defaults() error {
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.Lease < MinLease {
		return fmt.Errorf("%w: %v, at least %v", ErrLeaseTooShort, c.Lease, MinLease)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Store is what a replica needs of the shared store (state.Postgres
// opened with PostgresOptions.Replica). Times are the store's clock.
type Store interface {
	// Replica is this replica's id.
	Replica() string
	JoinReplicas(ctx context.Context, url string) error
	Heartbeat(ctx context.Context, url string, within time.Duration) ([]state.Replica, error)
	LeaveReplicas(ctx context.Context) error
	AcquireLease(ctx context.Context, kernel string, ttl time.Duration) (state.Lease, error)
	RenewLeases(ctx context.Context, held []state.Fence, ttl time.Duration) ([]state.Fence, error)
	ReleaseLease(ctx context.Context, f state.Fence) error
	TransferLease(ctx context.Context, f state.Fence, to string, ttl time.Duration) (state.Lease, error)
	PassLease(ctx context.Context, f state.Fence, from, to string, ttl time.Duration) (state.Lease, error)
	AdoptLease(ctx context.Context, f state.Fence, ttl time.Duration) error
	MarkLeaving(ctx context.Context) error
	LeaseOwner(ctx context.Context, kernel string) (state.Lease, error)
	FreeKernels(ctx context.Context) ([]string, error)
	Housekeep(ctx context.Context, deadFor time.Duration) (replicas, leases int, err error)
}

var _ Store = (*state.Postgres)(nil)

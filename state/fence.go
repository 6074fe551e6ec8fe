package state

import (
	"context"
	"errors"
	"fmt"
)

// ErrFenced: a write made under a Fence was refused because this replica
// does not hold the kernel's lease with that epoch (it lapsed, was taken
// by another replica or handed over). Nothing of the write was kept.
var ErrFenced = errors.New("state: the kernel's lease is not held with this epoch; write refused")

// Fence is the lease a write is made under: the kernel and the epoch of
// the lease the writer holds on it. Epochs grow with every new term of
// ownership of a kernel and never go back, so a replica that lost a lease
// (paused past it, cut off) and writes with its old epoch is refused.
type Fence struct {
	Kernel string
	Epoch  int64
}

func (f Fence) String() string { return fmt.Sprintf("%s@%d", f.Kernel, f.Epoch) }

// fencedError is ErrFenced naming the fence.
func fencedError(f *Fence) error {
	return fmt.Errorf("%w (kernel %s, epoch %d)", ErrFenced, f.Kernel, f.Epoch)
}

// Writer is the writing half of a Store; Store documents each method.
type Writer interface {
	PutKernel(ctx context.Context, k Kernel) error
	DeleteKernel(ctx context.Context, id string) error
	PutContext(ctx context.Context, c Context) error
	DeleteContext(ctx context.Context, id string) error
	PutSession(ctx context.Context, s Session) error
	DeleteSession(ctx context.Context, id string) error
	PutSandbox(ctx context.Context, s Sandbox) error
	DeleteSandbox(ctx context.Context, id string) error
	PutRun(id string, data []byte) error
	AppendRunEvents(id string, events ...Event) error
	DeleteRun(id string) error
	CommitRun(ctx context.Context, id string, data []byte) error
	CommitRunAsync(id string, data []byte, done func(error)) error
	Flush(ctx context.Context) error
}

// fencer is a store that checks fences: a Postgres store opened as a
// replica.
type fencer interface {
	fenced(f Fence) Writer
}

// Fenced returns s's writes made under f. On a store shared by replicas
// (a Postgres store opened with PostgresOptions.Replica) each of them is
// committed only if this replica holds f's lease, with f's epoch and not
// lapsed, when it is committed (checked in the commit's transaction,
// which holds the lease row until it ends, so an acquire by another
// replica waits for it); otherwise it is refused with ErrFenced: the
// durable writes (Put*, Delete*, CommitRun) return it, CommitRunAsync
// gives it to done, and queued run writes (PutRun, AppendRunEvents,
// DeleteRun) are dropped and logged. Writes of the same batch under
// other fences, or none, are committed all the same.
//
// A store of one gateway (Bolt, Memory, Postgres without a replica) has
// no leases: Fenced returns s itself, and writes are never refused.
func Fenced(s Store, f Fence) Writer {
	if fs, ok := s.(fencer); ok {
		return fs.fenced(f)
	}
	return s
}

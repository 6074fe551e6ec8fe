//go:build linux

package sessions

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"kernelgate/cluster"
	"kernelgate/internal/pgtest"
	"kernelgate/internal/testkernels"
	"kernelgate/kernelspecs"
	"kernelgate/provision/local"
	"kernelgate/state"
)

// TestLeaseLostLetsTheKernelGo: a replica holds the lease of each kernel
// it starts; when another replica takes the lease over (the first one's
// lapsed, as after a pause), the first lets the kernel go: its context
// is gone from it, its websocket client is closed, the kernel process
// goes on running, and a late write of its records under the old term
// is refused.
func TestLeaseLostLetsTheKernelGo(t *testing.T) {
	pg := pgtest.Start(t)
	url := pg.CreateDB("leases")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	open := func(id string) *state.Postgres {
		s, err := state.OpenPostgres(ctx, url, state.PostgresOptions{Replica: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	storeA, storeB := open("replica-a"), open("replica-b")
	var mgrA atomic.Pointer[Manager]
	repA, err := cluster.Start(storeA, cluster.Config{URL: "http://a.invalid:1", Lease: time.Second}, func(lost []state.Fence) {
		if m := mgrA.Load(); m != nil {
			m.LeasesLost(lost)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { repA.Leave(context.Background()) })
	repB, err := cluster.Start(storeB, cluster.Config{URL: "http://b.invalid:1", Lease: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { repB.Leave(context.Background()) })

	testkernels.Spec(t, "python3")
	dir := t.TempDir()
	os.Chmod(filepath.Dir(dir), 0o711)
	// Detached, as a gateway with a store launches them: the kernel
	// outlives this replica's hold on it.
	m := New(Config{Store: storeA, Ownership: repA}, kernelspecs.Load([]string{testkernels.Dir(t)}),
		&local.Provisioner{RuntimeDir: dir, Detached: true}, nil)
	mgrA.Store(m)
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		m.Close(cctx)
	})

	c, err := m.CreateContext(ctx, ContextRequest{ID: "agent", Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, ExecuteRequest{Code: "x = 41", Context: c.ID})
	cm := c.Model()
	if cm.KernelID == nil || cm.KernelProcessID == nil {
		t.Fatalf("the context has no running kernel: %+v", cm)
	}
	kernel, pid := *cm.KernelID, *cm.KernelProcessID
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if cm.Replica != "http://a.invalid:1" {
		t.Errorf("the context's replica: %q, want its owner's URL", cm.Replica)
	}
	l, err := storeB.LeaseOwner(ctx, kernel)
	if err != nil || l.Owner != "replica-a" {
		t.Fatalf("the kernel's lease: %+v, %v; want replica-a's", l, err)
	}
	k, err := m.Kernel(kernel)
	if err != nil {
		t.Fatal(err)
	}
	client, err := k.Attach("ws-session")
	if err != nil {
		t.Fatal(err)
	}

	// The lease lapses (as when replica A is paused past it) and B takes
	// it under the next epoch.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var taken state.Lease
	waitWithin(t, 20*time.Second, "replica B to take the lease over", func() bool {
		if _, err := conn.Exec(ctx, "UPDATE leases SET expires_at = now() WHERE kernel_id = $1 AND owner = 'replica-a'", kernel); err != nil {
			t.Fatal(err)
		}
		taken, err = repB.Keeper().Acquire(ctx, kernel)
		return err == nil
	})
	if taken.Epoch <= l.Epoch {
		t.Fatalf("B's epoch %d, want more than A's %d", taken.Epoch, l.Epoch)
	}

	waitWithin(t, 10*time.Second, "replica A to let the context go", func() bool {
		_, err := m.Context(c.ID)
		return errors.Is(err, ErrNoSuchContext)
	})
	if _, err := m.Kernel(kernel); err == nil {
		t.Errorf("replica A still serves the kernel after losing its lease")
	}
	select {
	case <-client.Done():
	case <-time.After(10 * time.Second):
		t.Errorf("the kernel's websocket client on replica A is still open")
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Errorf("the kernel process was stopped (%v): it is replica B's now", err)
	}
	// A late write of A for the kernel is refused; B's stands.
	if err := m.writer(kernel).PutKernel(ctx, state.Kernel{ID: kernel, Spec: "python3", Created: time.Now()}); !errors.Is(err, state.ErrFenced) {
		t.Errorf("replica A's late write of the kernel: %v, want state.ErrFenced", err)
	}
	if err := state.Fenced(storeB, taken.Fence()).PutKernel(ctx, state.Kernel{ID: kernel, Spec: "python3", Created: time.Now()}); err != nil {
		t.Errorf("replica B's write under its lease: %v", err)
	}
	// A's next run on the context is refused: nothing here acts for it.
	if _, err := m.Execute(ctx, ExecuteRequest{Code: "x + 1", Context: c.ID, Wait: true}); !errors.Is(err, ErrNoSuchContext) {
		t.Errorf("a run on the context let go: %v, want ErrNoSuchContext", err)
	}
}

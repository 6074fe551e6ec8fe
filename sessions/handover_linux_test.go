//go:build linux

package sessions

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"kernelgate/cluster"
	"kernelgate/internal/pgtest"
	"kernelgate/internal/testkernels"
	"kernelgate/kernelspecs"
	"kernelgate/provision/local"
	"kernelgate/runs"
	"kernelgate/state"
)

// TestHandoverMovesTheKernelToAPeer: replica A hands its context's kernel
// over to replica B as it stops: the run in progress finishes on A, a run
// asked for meanwhile waits and is told to go to B (MovedError naming B),
// the lease is B's under a later epoch, A's websocket client of the
// kernel is closed, B takes the kernel over (the same process, its state
// kept) and A has nothing of it left.
func TestHandoverMovesTheKernelToAPeer(t *testing.T) {
	pg := pgtest.Start(t)
	url := pg.CreateDB("handover")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	testkernels.Spec(t, "python3")
	specs := kernelspecs.Load([]string{testkernels.Dir(t)})
	replica := func(id, advertise string) (*Manager, *state.Postgres) {
		s, err := state.OpenPostgres(ctx, url, state.PostgresOptions{Replica: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		rep, err := cluster.Start(s, cluster.Config{URL: advertise, Lease: 2 * time.Second}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rep.Leave(context.Background()) })
		dir := t.TempDir()
		os.Chmod(filepath.Dir(dir), 0o711)
		m := New(Config{Store: s, Ownership: rep}, specs, &local.Provisioner{RuntimeDir: dir, Detached: true}, nil)
		t.Cleanup(func() {
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			m.Close(cctx)
		})
		return m, s
	}
	a, storeA := replica("replica-a", "http://a.invalid:1")
	b, _ := replica("replica-b", "http://b.invalid:1")

	c, err := a.CreateContext(ctx, ContextRequest{ID: "agent", Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	run(t, a, ExecuteRequest{Code: "n = 1", Context: c.ID})
	cm := c.Model()
	kernel, pid := *cm.KernelID, *cm.KernelProcessID
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	before, err := storeA.LeaseOwner(ctx, kernel)
	if err != nil {
		t.Fatal(err)
	}
	k, err := a.Kernel(kernel)
	if err != nil {
		t.Fatal(err)
	}
	client, err := k.Attach("ws-session")
	if err != nil {
		t.Fatal(err)
	}

	// A run in progress on A as it stops.
	slow, err := a.Execute(ctx, ExecuteRequest{Code: "import time; time.sleep(1); n += 1; n", Context: c.ID})
	if err != nil {
		t.Fatal(err)
	}
	waitWithin(t, 10*time.Second, "the slow run to start", func() bool { return slow.State() == runs.RunRunning })

	handed := make(chan HandoverReport, 1)
	go func() {
		handed <- a.HandOver(ctx, 30*time.Second, func(ctx context.Context, url, kernel string) error {
			if url != "http://b.invalid:1" {
				t.Errorf("the new owner told: %s, want B", url)
			}
			return b.AdoptKernel(ctx, kernel)
		})
	}()
	waitWithin(t, 10*time.Second, "A to start handing the kernel over", func() bool {
		return a.Leaving() && a.movedError("context:agent", "") != nil
	})
	// Asked for meanwhile: it waits, then goes to B.
	_, err = a.Execute(ctx, ExecuteRequest{Code: "n += 1; n", Context: c.ID, Wait: true})
	var moved *MovedError
	if !errors.As(err, &moved) {
		t.Fatalf("a run asked for while the kernel is handed over: %v, want a MovedError", err)
	}
	if to, err := moved.NewOwner(ctx); err != nil || to != "http://b.invalid:1" {
		t.Errorf("the new owner: %q, %v; want B's URL", to, err)
	}
	if err := slow.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if e := execution(t, slow); e.Process.Reason != runs.Completed || text(e) != "2" {
		t.Errorf("the run in progress when A began stopping: %+v, want completed with 2", e)
	}
	rep := <-handed
	if rep.Handed != 1 || rep.Unfinished != 0 || rep.Peers != 1 {
		t.Errorf("handover report %+v, want 1 kernel handed to 1 peer, no run unfinished", rep)
	}

	select {
	case <-client.Done():
	default:
		t.Errorf("the kernel's websocket client on A is still open after the handover (it should reconnect through any replica)")
	}
	after, err := storeA.LeaseOwner(ctx, kernel)
	if err != nil || after.Owner != "replica-b" || after.Epoch <= before.Epoch {
		t.Errorf("the kernel's lease after the handover: %+v, %v; want B's, after epoch %d", after, err, before.Epoch)
	}
	if _, err := a.Kernel(kernel); !errors.As(err, &moved) {
		t.Errorf("the kernel on A after the handover: %v, want a MovedError", err)
	}
	cb, err := b.Context(c.ID)
	if err != nil {
		t.Fatalf("B after the handover: %v", err)
	}
	if m := cb.Model(); m.KernelProcessID == nil || *m.KernelProcessID != pid {
		t.Errorf("the context on B: %+v, want its kernel process %d", m, pid)
	}
	if _, e := run(t, b, ExecuteRequest{Code: "n", Context: c.ID}); text(e) != "2" {
		t.Errorf("n on B: %+v, want 2 (the kernel's state kept)", e)
	}
}

// text is the text of a run's last result, "" without one.
func text(e runs.Execution) string {
	if len(e.Results) == 0 {
		return ""
	}
	return e.Results[len(e.Results)-1].Text
}

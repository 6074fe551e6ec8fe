package sessions

import (
	"context"
	"kernelgate/runs"
	"testing"
)

// An isolated run takes a ready kernel from the pool, which refills; a
// pooled kernel that died while it waited is not handed out.
func TestPoolHandsOutReadyKernelsAndRefills(t *testing.T) {
	f := &fakeKernels{}
	m := newFakeManager(t, Config{PoolSize: 1}, f)
	if err := m.WarmPools().Prewarm([]string{"python"}); err != nil {
		t.Fatal(err)
	}
	ready := func() int {
		ps := m.WarmPools().Stats()
		if len(ps) != 1 {
			return 0
		}
		return ps[0].Ready
	}
	waitFor(t, "the pool to fill", func() bool { return ready() == 1 })

	_, e := run(t, m, ExecuteRequest{Code: "print isolated", Isolated: true})
	if e.Process.Reason != runs.Completed || len(e.Logs.Stdout) != 1 {
		t.Fatalf("isolated run: %+v %+v", e.Process, e.Logs)
	}
	if ps := m.WarmPools().Stats()[0]; ps.Hits != 1 || ps.Misses != 0 {
		t.Errorf("pool stats %+v, want one hit", ps)
	}
	waitFor(t, "the pool to refill", func() bool { return ready() == 1 })
	if n := len(f.kernels()); n != 2 {
		t.Errorf("%d kernels started, want 2 (the pooled one and its replacement)", n)
	}
	// The isolated run's kernel is gone with its run.
	waitFor(t, "the isolated kernel to be shut down", func() bool { return len(m.Kernels()) == 0 })

	// The ready kernel dies while it waits: the next run starts its own.
	ks := f.kernels()
	ks[len(ks)-1].crash()
	m.warm.mu.Lock()
	p := m.warm.bySpec["fake"]
	m.warm.mu.Unlock()
	waitFor(t, "the pooled kernel's death to be seen", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.ready) == 1 && !p.ready[0].Running()
	})
	_, e = run(t, m, ExecuteRequest{Code: "print again", Isolated: true})
	if e.Process.Reason != runs.Completed {
		t.Fatalf("isolated run after the pooled kernel died: %+v", e.Process)
	}
	if ps := m.WarmPools().Stats()[0]; ps.Misses != 1 {
		t.Errorf("pool stats %+v, want one miss", ps)
	}
}

// A kernel of the Jupyter surface that dies is restarted, a bounded
// number of times; then it stays dead.
func TestDyingKernelIsRestartedWithinItsLimit(t *testing.T) {
	f := &fakeKernels{}
	m := newFakeManager(t, Config{RestartLimit: 2}, f)
	k, err := m.StartKernel(context.Background(), StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 2; i++ {
		ks := f.kernels()
		ks[len(ks)-1].crash()
		waitFor(t, "the restart", func() bool { return len(f.kernels()) == i+1 && k.Running() })
		if st := k.Model().ExecutionState; st != "idle" {
			t.Errorf("after restart %d the kernel is %s", i, st)
		}
	}
	ks := f.kernels()
	ks[len(ks)-1].crash()
	waitFor(t, "the kernel to stay dead", func() bool { return k.Model().ExecutionState == "dead" })
	if n := len(f.kernels()); n != 3 {
		t.Errorf("%d processes started, want 3 (the first and two restarts)", n)
	}
	if k.Model().Reason == "" {
		t.Error("a dead kernel without a reason")
	}
}

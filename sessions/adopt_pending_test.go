package sessions

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kernelgate/internal/leakcheck"
	"kernelgate/jupyter"
	"kernelgate/provision/local"
	"kernelgate/runs"
)

// fakeConnecting is a kept kernel being connected to: it answers when the
// test says so (answer), fails (fail), or gives up when its context ends.
type fakeConnecting struct {
	pid        int
	done       chan struct{}
	answer     chan process
	failWith   chan error
	proc       process
	err        error
	interrupts atomic.Int32
}

func newFakeConnecting(ctx context.Context, pid int) *fakeConnecting {
	c := &fakeConnecting{pid: pid, done: make(chan struct{}), answer: make(chan process, 1), failWith: make(chan error, 1)}
	go func() {
		defer close(c.done)
		select {
		case c.proc = <-c.answer:
		case c.err = <-c.failWith:
		case <-ctx.Done():
			c.err = fmt.Errorf("%w: %w", jupyter.ErrConnectFailed, ctx.Err())
		}
	}()
	return c
}

func (c *fakeConnecting) Done() <-chan struct{} { return c.done }
func (c *fakeConnecting) Result() (process, error) {
	<-c.done
	return c.proc, c.err
}
func (c *fakeConnecting) PID() int { return c.pid }
func (c *fakeConnecting) Interrupt(context.Context) error {
	c.interrupts.Add(1)
	return nil
}

// A start on the store of a gateway whose kernels were busy serves
// without waiting for them: each is kept (its pid shown, busy), runs wait
// for it, an interrupt reaches it; it is adopted when it answers, stopped
// when its context is deleted, and reported lost (stopped too) when it
// fails to answer with its key. Nothing is left running afterwards.
func TestRestoreKeepsBusyKernels(t *testing.T) {
	before := leakcheck.Snapshot(t)
	dir := t.TempDir()
	store := openStore(t, dir)
	f := &fakeKernels{}
	specs := fakeSpecs(t)
	m1 := New(Config{DefaultKernel: "fake", Languages: map[string]string{"python": "fake"}, Store: store}, specs, nil, nil)
	m1.start = f.start
	ctx := context.Background()
	pids := map[string]int{}
	for i, id := range []string{"agent", "other", "third"} {
		c, err := m1.CreateContext(ctx, ContextRequest{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		pids[c.KernelID()] = 1001 + i
	}
	m1.Detach(ctx)
	// The fake processes say nothing of how to find them again: their
	// records are given what a local kernel's hold.
	for _, rec := range load(t, store).Kernels {
		rec.Provisioner = "local"
		data, _ := json.Marshal(local.Info{PID: pids[rec.ID]})
		rec.ProvisionerInfo, _ = jupyter.ProvisionerInfo{Provisioner: local.InfoName, Data: data}.Marshal()
		if err := store.PutKernel(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}

	m2 := New(Config{DefaultKernel: "fake", Languages: map[string]string{"python": "fake"}, Store: store}, specs, nil, nil)
	m2.start = f.start
	m2.promptAdopt = 10 * time.Millisecond
	var mu sync.Mutex
	conns := map[int]*fakeConnecting{}
	var stopped []int
	m2.reconnect = func(ctx context.Context, info jupyter.ProvisionerInfo, _ jupyter.Config) (connecting, error) {
		c := newFakeConnecting(ctx, localPID(t, info))
		mu.Lock()
		conns[localPID(t, info)] = c
		mu.Unlock()
		return c, nil
	}
	m2.stopKept = func(_ context.Context, info jupyter.ProvisionerInfo) error {
		mu.Lock()
		stopped = append(stopped, localPID(t, info))
		mu.Unlock()
		return nil
	}
	wasStopped := func(pid int) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range stopped {
			if p == pid {
				return true
			}
		}
		return false
	}
	rep, err := m2.Restore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Pending != 3 || rep.Adopted != 0 || rep.Lost != 0 || len(rep.Keep) != 3 {
		t.Fatalf("restore: %+v, want 3 pending and kept", rep)
	}
	agent, _ := m2.Context("agent")
	if cm := agent.Model(); !cm.Active || cm.KernelProcessID == nil || *cm.KernelProcessID != 1001 || cm.ExecutionState != "busy" {
		t.Fatalf("the busy kernel's context: %+v", cm)
	}
	if err := interruptContext(m2, ctx, "agent"); err != nil || conns[1001].interrupts.Load() != 1 {
		t.Fatalf("interrupting the busy kernel: %v, %d interrupts", err, conns[1001].interrupts.Load())
	}

	// A run waits for the kernel, and runs on it once it answered.
	r, err := m2.Execute(ctx, ExecuteRequest{Context: "agent", Code: "x = 1"})
	if err != nil {
		t.Fatal(err)
	}
	k, _ := m2.Kernel(agent.KernelID())
	adoptee, _ := f.start(ctx, k.config())
	conns[1001].answer <- adoptee
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.Wait(wctx); err != nil || execution(t, r).Process.Reason != runs.Completed {
		t.Fatalf("the run behind the adoption: %v %+v", err, execution(t, r).Process)
	}
	if wasStopped(1001) {
		t.Fatal("the adopted kernel was stopped")
	}

	// Deleting a context whose kernel is still busy stops that kernel.
	if err := m2.DeleteContext(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	if !wasStopped(1002) {
		t.Fatal("the busy kernel of a deleted context was not stopped")
	}

	// A kernel that signs with another key is stopped and reported lost.
	conns[1003].failWith <- fmt.Errorf("%w: %w", jupyter.ErrConnectFailed, jupyter.ErrWrongKey)
	waitFor(t, "the kernel with another key to be stopped", func() bool { return wasStopped(1003) })
	_, e := run(t, m2, ExecuteRequest{Context: "third", Code: "print x"})
	if !strings.Contains(e.Process.Message, "without the earlier state") {
		t.Fatalf("the first run after the kernel was lost: %+v", e.Process)
	}

	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	within(t, "Manager.Close", 15*time.Second, func() { m2.Close(cctx) })
	store.Close()
	leakcheck.Check(t, before)
}

// localPID is the pid a local kernel's info names.
func localPID(t *testing.T, info jupyter.ProvisionerInfo) int {
	li, err := local.InfoOf(info)
	if err != nil {
		t.Error(err)
		return 0
	}
	return li.PID
}

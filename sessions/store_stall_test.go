package sessions

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kernelgate/jupyter"
	"kernelgate/runs"
	"kernelgate/state"
)

// A store whose disk does not answer holds up no kernel: a run prints
// megabytes while the store's writer is stuck in a commit, and its output
// reaches the run's caller and a client of the kernel (a websocket) all
// the same, the run ends, and the store holds no more than its bound
// meanwhile. Once the disk answers, the run's record and every one of
// its events reach the store (what it refused was kept in the run and
// written then), so nothing is missing after a restart.
func TestRunOutputFlowsWhileTheStoreIsStuck(t *testing.T) {
	const maxQueued = 256 << 10
	var mu sync.Mutex
	var batches []int // sizes of the batches committed after the held one
	store := openHeldStore(t, state.Options{MaxQueued: maxQueued}, func(n int, afterHeld bool) {
		if afterHeld {
			mu.Lock()
			batches = append(batches, n)
			mu.Unlock()
		}
	})
	m := newRealManager(t, Config{Store: store, PoolSize: 0})
	t.Cleanup(store.unhold) // before the manager and the store close

	ctx := context.Background()
	c, err := m.CreateContext(ctx, ContextRequest{ID: "chatty", Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	k, err := m.Kernel(c.KernelID())
	if err != nil {
		t.Fatal(err)
	}
	// A client of the kernel, as a websocket is, reading all it gets.
	ws, err := k.Attach("watcher")
	if err != nil {
		t.Fatal(err)
	}
	var wsBytes atomic.Int64
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			outs, err := ws.Take()
			if err != nil {
				return
			}
			for _, o := range outs {
				if o.Msg.Type() == jupyter.StreamMsg {
					var s struct{ Text string }
					o.Msg.DecodeContent(&s)
					wsBytes.Add(int64(strings.Count(s.Text, "x")))
				}
			}
			select {
			case <-ws.Ready():
			case <-ws.Done():
			}
		}
	}()
	t.Cleanup(func() { ws.Close(); <-readerDone })

	// 4 MiB, 16 times the store's bound, in a message a line.
	const lines, width = 4096, 1023
	gate := filepath.Join(t.TempDir(), "go")
	code := fmt.Sprintf("import os, time\nprint('ready', flush=True)\nwhile not os.path.exists(%q):\n    time.sleep(0.01)\nline = 'x' * %d\nfor i in range(%d):\n    print(line, flush=True)\n", gate, width, lines)
	r, err := m.Execute(ctx, ExecuteRequest{Context: c.ID, Code: code})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the run to print ready", func() bool {
		evs, _, _ := r.Events(0)
		for _, ev := range evs {
			if ev.Type == "stdout" {
				return true
			}
		}
		return false
	})
	// The disk stops answering: the writer's next commit hangs.
	store.hold()
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-store.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the store's writer did not commit once the run printed")
	}

	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := r.Wait(wctx); err != nil {
		t.Fatalf("the run did not end while the store was stuck: %d bytes of stdout came, a client of the kernel got %d", stdoutX(r), wsBytes.Load())
	}
	if got := stdoutX(r); got != lines*width {
		t.Fatalf("the run's caller got %d bytes of output while the store was stuck, want %d", got, lines*width)
	}
	waitFor(t, "the kernel's client to get the output", func() bool { return wsBytes.Load() == lines*width })
	select {
	case <-store.release:
		t.Fatal("the store was released before the run ended")
	default:
	}

	// The disk answers again.
	store.unhold()
	var rec state.Run
	waitFor(t, "the whole run in the store", func() bool {
		snap, err := store.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, sr := range snap.Runs {
			if sr.ID == r.ID {
				rec = sr
			}
		}
		return len(rec.Events) == r.LastSeq() && strings.Contains(string(rec.Data), `"state":"done"`)
	})
	mu.Lock()
	piled := batches[0] // what was queued while the writer was held
	mu.Unlock()
	// The bound, and one write of a line's message beyond it at most.
	if piled > maxQueued+4096 {
		t.Errorf("the store held %d bytes of writes while stuck, over its bound of %d", piled, maxQueued)
	}
	kept := 0
	for i, e := range rec.Events {
		if e.Seq != uint64(i+1) {
			t.Fatalf("event %d of the run in the store has seq %d", i+1, e.Seq)
		}
		var ev struct{ Type, Text string }
		json.Unmarshal(e.Data, &ev)
		if ev.Type == "stdout" {
			kept += strings.Count(ev.Text, "x")
		}
	}
	var rr runs.Record
	json.Unmarshal(rec.Data, &rr)
	var exec runs.Execution
	json.Unmarshal(rr.Execution, &exec)
	if kept != lines*width || exec.Truncated || strings.Count(strings.Join(exec.Logs.Stdout, ""), "x") != lines*width {
		t.Fatalf("the store kept %d bytes of output in events and %d in the runs.Execution (truncated %v), want %d", kept, strings.Count(strings.Join(exec.Logs.Stdout, ""), "x"), exec.Truncated, lines*width)
	}
}

// stdoutX counts the x the run's caller has read on stdout.
func stdoutX(r *runs.Run) int {
	evs, _, _ := r.Events(0)
	n := 0
	for _, ev := range evs {
		if ev.Type == "stdout" {
			var e struct{ Text string }
			json.Unmarshal(ev.JSON, &e)
			n += strings.Count(e.Text, "x")
		}
	}
	return n
}

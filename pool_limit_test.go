//go:build linux

package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestPoolWithinMaxKernels: with --max-kernels 4 --pool-size 1 the warm
// pool's kernel counts toward the limit. Kernel processes (counted in
// /proc all along, not from the gateway's list) never pass 4 while
// contexts and isolated runs are made; a user's fourth kernel takes the
// pooled kernel's place instead of a 429; a fifth is refused.
func TestPoolWithinMaxKernels(t *testing.T) {
	bin := buildBinary(t)
	dirs := newRestartDirs(t)
	g := dirs.start(t, bin, "--max-kernels", "4", "--pool-size", "1", "--pool-prewarm", "python")

	// Count the kernel processes every few milliseconds until the end.
	var mu sync.Mutex
	most, samples := 0, 0
	var mostPids []int
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			pids := kernelsOnly(kernelProcs(dirs.runtime, false))
			mu.Lock()
			samples++
			if len(pids) > most {
				most, mostPids = len(pids), pids
			}
			mu.Unlock()
		}
	}()
	defer func() { // also when a check below fails first
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-sampled
	}()
	waitFor(t, func() bool { return len(kernelsOnly(kernelProcs(dirs.runtime, false))) == 1 }, "the warm pool did not fill", func() []any { return nil })

	// Four contexts: the fourth takes the pooled kernel's place.
	for i := 1; i <= 4; i++ {
		call(t, "POST", g.url+"api/contexts", map[string]any{"id": fmt.Sprintf("c%d", i), "language": "python"}, 201, nil)
	}
	// A fifth kernel, of any kind, is past the limit.
	var refused struct{ Code string }
	call(t, "POST", g.url+"api/contexts", map[string]any{"id": "c5", "language": "python"}, 429, &refused)
	call(t, "POST", g.url+"api/execute", map[string]any{"code": "1", "isolated": true}, 429, nil)
	if refused.Code != "RESOURCE_EXHAUSTED" {
		t.Errorf("the fifth context: code %q, want RESOURCE_EXHAUSTED", refused.Code)
	}
	for i := 1; i <= 4; i++ {
		if e := execute(t, g.url, fmt.Sprintf("c%d", i), "6 * 7"); e.text() != "42" {
			t.Fatalf("c%d: %+v", i, e)
		}
	}

	// Room for two: isolated runs one after another (each from the pool
	// or a kernel of its own, the pool refilling behind them), and
	// contexts made again between them.
	call(t, "DELETE", g.url+"api/contexts/c3", nil, 204, nil)
	call(t, "DELETE", g.url+"api/contexts/c4", nil, 204, nil)
	for i := 0; i < 4; i++ {
		var e execution
		call(t, "POST", g.url+"api/execute", map[string]any{"code": "6 * 7", "isolated": true}, 200, &e)
		if e.text() != "42" {
			t.Fatalf("isolated run %d: %+v", i, e)
		}
		id := fmt.Sprintf("again%d", i)
		call(t, "POST", g.url+"api/contexts", map[string]any{"id": id, "language": "python"}, 201, nil)
		call(t, "POST", g.url+"api/contexts", map[string]any{"id": id + "b", "language": "python"}, 201, nil)
		call(t, "DELETE", g.url+"api/contexts/"+id, nil, 204, nil)
		call(t, "DELETE", g.url+"api/contexts/"+id+"b", nil, 204, nil)
	}

	close(stop)
	<-sampled
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d samples of the kernel processes; at most %d", samples, most)
	if most > 4 {
		t.Errorf("%d kernel processes at once (%v) under --max-kernels 4", most, mostPids)
	}
}

// kernelsOnly keeps the kernels of pids: the processes started with a
// connection file, not the helpers a kernel's directory also names, nor
// a kernel's own children, which carry its command line from their fork
// until they exec (ipykernel runs `ip addr` as it starts).
func kernelsOnly(pids []int) []int {
	named := map[int]int{} // pid → parent
	for _, pid := range pids {
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && bytes.Contains(cmd, []byte(".json")) {
			named[pid] = parentOf(pid)
		}
	}
	var out []int
	for _, pid := range pids {
		if parent, ok := named[pid]; ok {
			if _, child := named[parent]; !child {
				out = append(out, pid)
			}
		}
	}
	return out
}

// parentOf is the parent of process pid, 0 when it cannot be read.
func parentOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid …: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(string(f[1]))
	return ppid
}

//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"

	"kernelgate/internal/leakcheck"
)

// SIGTERM while a run streams output for ever: the run ends lost once the
// shutdown grace has passed, and the process exits 0 within a bounded
// time, leaving no kernel behind.
func TestSIGTERMWhileRunStreamsExits(t *testing.T) {
	bin := buildBinary(t)
	t.Setenv("KERNELGATE_SHUTDOWN_GRACE", "1s")
	gw := startGateway(t, bin)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	body := `{"code": "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(.5)"}`
	req, _ := http.NewRequestWithContext(ctx, "POST", gw.url+"api/execute", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /api/execute: %d", resp.StatusCode)
	}
	events := make(chan map[string]any, 1000)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var ev map[string]any
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				events <- ev
			}
		}
	}()
	for ev := range events {
		if ev["type"] == "stdout" {
			break
		}
	}

	kids := descendants(gw.cmd.Process.Pid)
	signalled := time.Now()
	gw.cmd.Process.Signal(syscall.SIGTERM)
	var end map[string]any
	for ev := range events {
		if ev["type"] == "end" {
			end = ev
		}
	}
	select {
	case err := <-gw.done:
		if err != nil {
			t.Errorf("kernelgate exit: %v\n%s", err, gw.logs)
		}
	case <-time.After(30 * time.Second): // the grace plus shutdownStop, with room
		gw.cmd.Process.Kill()
		t.Fatalf("kernelgate still running %v after SIGTERM\n%s", time.Since(signalled).Round(time.Second), gw.logs)
	}
	if end == nil {
		t.Errorf("the stream ended without an end event")
	} else if p, _ := end["process"].(map[string]any); p["reason"] != "lost" {
		t.Errorf("end event %v: want reason lost", end)
	}
	for _, pid := range kids {
		if processAlive(pid) {
			t.Errorf("process %d outlived kernelgate", pid)
		}
	}
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	p, err := procfs.NewProc(pid)
	if err != nil {
		return false
	}
	st, err := p.Stat()
	return err == nil && st.State != "Z"
}

// A gateway killed with SIGKILL leaves the processes its kernels started,
// its kernels' directories (connection files with keys) and cgroups; the
// next start removes them.
func TestStartAfterCrashRemovesWhatWasLeft(t *testing.T) {
	bin := buildBinary(t)
	runtime := t.TempDir()
	args := []string{"--runtime-dir", runtime, "--state-dir=", "--pool-size", "0"}
	gw := startGateway(t, bin, args...)
	resp, err := http.Post(gw.url+"api/execute", "application/json",
		strings.NewReader(`{"code": "import subprocess\np = subprocess.Popen(['sleep', '314'])\nprint(p.pid)"}`))
	if err != nil {
		t.Fatal(err)
	}
	var exec struct {
		Logs struct{ Stdout []string } `json:"logs"`
	}
	err = json.NewDecoder(resp.Body).Decode(&exec)
	resp.Body.Close()
	if err != nil || len(exec.Logs.Stdout) == 0 {
		t.Fatalf("run: %v %+v", err, exec)
	}
	child, err := strconv.Atoi(strings.TrimSpace(strings.Join(exec.Logs.Stdout, "")))
	if err != nil {
		t.Fatal(err)
	}
	dirs, _ := filepath.Glob(filepath.Join(runtime, "kernel-*"))
	cgroups := leakcheck.KernelgateCgroups(t, child)
	if len(dirs) == 0 {
		t.Fatalf("no kernel directory in %s", runtime)
	}

	gw.cmd.Process.Kill()
	<-gw.done
	if !processAlive(child) {
		t.Fatalf("the kernel's child %d did not outlive the killed gateway: nothing to test", child)
	}

	startGateway(t, bin, args...)
	if !pollUntil(20*time.Second, func() bool { return !processAlive(child) }) {
		t.Errorf("process %d, started by a kernel of the killed gateway, still runs after the next start", child)
	}
	for _, p := range append(dirs, cgroups...) {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s is still there after the next start", p)
		}
	}
}

// pollUntil polls cond until it holds or d has passed, and reports whether it
// held.
func pollUntil(d time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			return cond()
		}
	}
	return true
}

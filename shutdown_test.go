package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
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
		if alive(pid) {
			t.Errorf("process %d outlived kernelgate", pid)
		}
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	st, err := readStat(pid)
	return err == nil && !strings.Contains(st, ") Z ")
}

func readStat(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return string(b), err
}

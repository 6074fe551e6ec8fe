//go:build linux

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestStreamedRunSurvivesSIGKILL: a streamed run whose start event (with
// its id) and first output reached the client is known to the next
// gateway after a SIGKILL right then, though no other write followed it:
// its record was committed before its id left the gateway. The kernel runs
// the code to its end while no gateway runs; the next gateway picks the
// run up and ends it with what was kept and the lost-output marker.
func TestStreamedRunSurvivesSIGKILL(t *testing.T) {
	bin := buildBinary(t)
	dirs := newRestartDirs(t)
	g := dirs.start(t, bin, "--pool-size", "0")
	call(t, "POST", g.url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, nil)
	done := filepath.Join(t.TempDir(), "done")
	code := fmt.Sprintf("import time, pathlib\nprint('started', flush=True)\nwhile not pathlib.Path(%q + '.go').exists():\n    time.sleep(0.05)\nx = 41\npathlib.Path(%q).write_text('1')\nx + 1", done, done)
	run := streamRun(t, g.url, "agent", code, 1)
	g.kill(t, syscall.SIGKILL)
	os.WriteFile(done+".go", nil, 0o600)
	waitFor(t, func() bool { _, err := os.Stat(done); return err == nil }, "the run did not end while no gateway ran%s", func() []any { return []any{""} })

	g2 := dirs.start(t, bin, "--pool-size", "0")
	var rm struct {
		ID        string    `json:"id"`
		State     string    `json:"state"`
		Execution execution `json:"execution"`
	}
	call(t, "GET", g2.url+"api/runs/"+run, nil, 200, &rm)
	evs := runEvents(t, g2.url, run, 0)
	var texts []string
	for _, ev := range evs {
		texts = append(texts, ev.Text)
	}
	all := strings.Join(texts, "")
	if evs[0].Type != "start" || evs[len(evs)-1].Process.Reason != "completed" || !strings.Contains(all, "no gateway was running") {
		t.Fatalf("events of the run after the restart: %+v", evs)
	}
	call(t, "GET", g2.url+"api/runs/"+run, nil, 200, &rm)
	if rm.ID != run || rm.State != "done" || !strings.Contains(strings.Join(rm.Execution.Logs.Stderr, ""), "no gateway was running") {
		t.Fatalf("the run's record after the restart: %+v", rm)
	}
	if e := execute(t, g2.url, "agent", "x"); e.text() != "41" {
		t.Fatalf("the context after the restart: %+v", e)
	}
}

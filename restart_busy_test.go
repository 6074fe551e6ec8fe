//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRestartWhileKernelBusy: a gateway killed while a context's kernel is
// busy with a run for longer than a reconnection waits comes back serving
// at once; it keeps the busy kernel (same process, same state), picks the
// run up to its normal end, and runs the context's next run behind it.
func TestRestartWhileKernelBusy(t *testing.T) {
	bin := buildBinary(t)
	// Each case's run waits until the test writes to the file %[1]q,
	// then sets y = x + 1 and shows it; pid shows y and the kernel's pid.
	cases := []struct {
		name, language, setX, busy, pid string
		fifo                            bool
	}{
		// Deno answers kernel_info on control while its shell awaits,
		// but publishes nothing for it.
		{name: "deno", language: "javascript", setX: "globalThis.x = 41",
			busy: "console.log('started');\nwhile (!(await Deno.stat(%q).then(() => true, () => false))) await new Promise((r) => setTimeout(r, 50));\nglobalThis.y = x + 1;\ny",
			pid:  "`${y} ${Deno.pid}`"},
		// ipykernel answers on control while its shell sleeps, but not
		// while a call holds the interpreter lock (here a read from a
		// FIFO through ctypes.PyDLL, which keeps the lock). The output
		// thread is let send 'started' first.
		{name: "python-gil", language: "python", setX: "x = 41", fifo: true,
			busy: "import ctypes, os, sys, threading\nprint('started', flush=True)\nsent = threading.Event()\nsys.stdout.pub_thread.schedule(sent.set)\nsent.wait()\nfd = os.open(%q, os.O_RDWR)\nctypes.PyDLL(None).read(fd, ctypes.create_string_buffer(1), 1)\ny = x + 1\ny",
			pid:  "import os\nf'{y} {os.getpid()}'"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dirs := newRestartDirs(t)
			g := dirs.start(t, bin, "--pool-size", "0")
			var c ctxModel
			call(t, "POST", g.url+"api/contexts", map[string]any{"id": "busy", "language": tc.language}, 201, &c)
			if e := execute(t, g.url, "busy", tc.setX); e.Process.Reason != "completed" {
				t.Fatalf("setting x: %+v", e)
			}
			gate := filepath.Join(t.TempDir(), "gate")
			if tc.fifo {
				if err := syscall.Mkfifo(gate, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			run := streamRun(t, g.url, "busy", fmt.Sprintf(tc.busy, gate), 1)
			// Run records are committed in batches, at the latest with
			// the next durable write: this one.
			call(t, "POST", g.url+"api/contexts/busy/tokens", map[string]any{"ttl": 60}, 201, nil)
			g.kill(t, syscall.SIGKILL)

			// The next start serves while the kernel is still busy, and
			// the run is still running.
			g2 := dirs.start(t, bin, "--pool-size", "0")
			var rm struct {
				State     string    `json:"state"`
				Execution execution `json:"execution"`
			}
			call(t, "GET", g2.url+"api/runs/"+run, nil, 200, &rm)
			if rm.State != "running" {
				t.Fatalf("the busy run after the restart: %+v, want running\n%s", rm, g2.logs)
			}
			// The context's next run queues behind it.
			next := make(chan execution, 1)
			go func() {
				var e execution
				b, _ := json.Marshal(map[string]any{"context": "busy", "code": tc.pid})
				if resp, err := http.Post(g2.url+"api/execute", "application/json", bytes.NewReader(b)); err == nil {
					json.NewDecoder(resp.Body).Decode(&e)
					resp.Body.Close()
				}
				next <- e
			}()
			var cm ctxModel
			waitFor(t, func() bool {
				call(t, "GET", g2.url+"api/contexts/busy", nil, 200, &cm)
				return len(cm.ProcessIDs) == 3
			}, "the next run is not listed: %+v", func() []any { return []any{cm} })
			var queued struct{ State string }
			call(t, "GET", g2.url+"api/runs/"+cm.ProcessIDs[2], nil, 200, &queued)
			if queued.State != "queued" {
				t.Fatalf("the run behind the busy one is %q, want queued", queued.State)
			}

			// Once the kernel is done, the picked-up run ends normally,
			// with what it printed before the crash and the marker.
			if err := os.WriteFile(gate, []byte("1"), 0o600); err != nil {
				t.Fatal(err)
			}
			evs := runEvents(t, g2.url, run, 0)
			var texts []string
			for _, ev := range evs {
				texts = append(texts, ev.Text)
			}
			all := strings.Join(texts, "")
			if evs[len(evs)-1].Process.Reason != "completed" || !strings.Contains(all, "started") || !strings.Contains(all, "no gateway was running") {
				t.Fatalf("events of the busy run: %+v\n%s", evs, g2.logs)
			}
			call(t, "GET", g2.url+"api/runs/"+run, nil, 200, &rm)
			if rm.State != "done" || !strings.Contains(rm.Execution.text(), "42") {
				t.Fatalf("the busy run's record: %+v\n%s", rm, g2.logs)
			}
			// The next run sees its state, in the same process.
			select {
			case e := <-next:
				if want := fmt.Sprintf("42 %d", *c.KernelProcessID); !strings.Contains(e.text(), want) {
					t.Fatalf("the run behind the busy one: %+v, want %q", e, want)
				}
			case <-time.After(60 * time.Second):
				t.Fatalf("the run behind the busy one did not end\n%s", g2.logs)
			}
			if got := kernelProcs(dirs.runtime, false); !slices.Equal(got, []int{*c.KernelProcessID}) {
				t.Fatalf("kernel processes %v, want the one kept (%d)", got, *c.KernelProcessID)
			}
			if err := g2.kill(t, syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			waitProcs(t, dirs.runtime, true, nil)
		})
	}
}

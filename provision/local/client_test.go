//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/testkernels"
	"kernelgate/kernelspecs"

	"kernelgate/jupyter"
)

// These tests of the kernel client (package jupyter has them, with a
// minimal provisioner of its own) run here through the local provisioner
// too: its interrupts, failed starts, cleanup and escalation are the
// gateway's.

// startKernel starts the named real kernel and shuts it down when the test ends.
func startKernel(t *testing.T, name string) *jupyter.Kernel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	k, err := jupyter.Start(ctx, &Provisioner{RuntimeDir: t.TempDir()}, jupyter.Config{Spec: testkernels.Spec(t, name)})
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() { k.Shutdown(context.Background()) })
	return k
}

func TestInterrupt(t *testing.T) {
	cases := []struct {
		kernel, setup, check, want, block string
		// running is the message that shows the code runs: ipykernel
		// ignores SIGINT until the code has started. Without one, the
		// code writes to a FIFO of the test (block has a %q for its path)
		// right before it spins: Deno's execute_input comes before the
		// code runs, and an interrupt that arrives in between is lost.
		running jupyter.MsgType
	}{
		{"python3", "kept = 'yes'", "kept", "'yes'", pySleeping, jupyter.StreamMsg},
		{"deno", "const kept = 'yes'", "kept", `"yes"`, "Deno.writeTextFileSync(%q, 'x'); while (true) {}", ""},
	}
	for _, c := range cases {
		t.Run(c.kernel, func(t *testing.T) {
			k := startKernel(t, c.kernel)
			execute(t, k, c.setup)
			col := newCollector()
			// With stop_on_error, ipykernel aborts a request that reaches
			// it while it finishes the interrupted one's error reply; the
			// check below is sent as soon as that reply is in.
			code, started := c.block, make(chan error, 1)
			if c.running == "" {
				fifo := filepath.Join(t.TempDir(), "started")
				if err := syscall.Mkfifo(fifo, 0o600); err != nil {
					t.Fatal(err)
				}
				code = fmt.Sprintf(c.block, fifo)
				go func() {
					f, err := os.Open(fifo) // until the code opens it to write
					if err == nil {
						_, err = f.Read(make([]byte, 1))
						f.Close()
					}
					started <- err
				}()
				// A reader still waiting for a writer is let go.
				defer func() {
					if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
						f.Close()
					}
				}()
			}
			block := jupyter.NewExecute(code)
			block.StopOnError = false
			call, err := k.StartExecute(block, col.handle)
			if err != nil {
				t.Fatal(err)
			}
			if c.running != "" {
				col.await(t, c.running, 10*time.Second)
			} else {
				select {
				case err := <-started:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the code did not start")
				}
			}
			t0 := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := k.Interrupt(ctx); err != nil {
				t.Fatal(err)
			}
			reply, err := call.Wait(ctx)
			if err != nil {
				var seen []string
				for _, m := range col.msgs {
					seen = append(seen, string(m.Header.MsgType)+":"+string(m.RawContent))
				}
				t.Fatalf("%v; got %v; kernel output: %s", err, seen, k.Output())
			}
			if took := time.Since(t0); took > 2*time.Second {
				t.Errorf("interrupt took %v, want under 2s", took)
			}
			if r := replyOf(t, reply); r.Status != "error" {
				t.Errorf("interrupted reply status = %q, want error", r.Status)
			}
			_, after := execute(t, k, c.check)
			if got := plainText(t, contentOf(t, after.await(t, jupyter.ExecuteResult, 2*time.Second))); got != c.want {
				t.Errorf("state after interrupt: got %q, want %q", got, c.want)
			}
		})
	}
}

func TestStartFailures(t *testing.T) {
	dir := t.TempDir()
	write := func(name, argv string) *kernelspecs.Spec {
		d := filepath.Join(dir, name)
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "kernel.json"), []byte(`{"argv": `+argv+`, "display_name": "x", "language": "python"}`), 0o644)
		s, err := kernelspecs.Parse(d)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	cases := []struct {
		name string
		spec *kernelspecs.Spec
		want []string
	}{
		{"exits at once", write("exits", `["/usr/bin/python3", "-c", "import sys; print('no-such-kernel-module', file=sys.stderr); sys.exit(3)"]`), []string{"exit status 3", "no-such-kernel-module"}},
		{"bad path", write("badpath", `["/nonexistent/kernel", "{connection_file}"]`), []string{"/nonexistent/kernel"}},
		{"missing module", write("nomodule", `["/usr/bin/python3", "-m", "no_such_kernel_xyz", "-f", "{connection_file}"]`), []string{"No module named no_such_kernel_xyz"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			t0 := time.Now()
			_, err := jupyter.Start(ctx, &Provisioner{RuntimeDir: t.TempDir()}, jupyter.Config{Spec: c.spec})
			if !errors.Is(err, jupyter.ErrStartFailed) {
				t.Fatalf("err = %v, want ErrStartFailed", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if took := time.Since(t0); took > 5*time.Second {
				t.Errorf("failing start took %v", took)
			}
		})
	}
	t.Run("never ready", func(t *testing.T) {
		spec := write("sleeper", `["/bin/sleep", "60"]`)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := jupyter.Start(ctx, &Provisioner{RuntimeDir: t.TempDir()}, jupyter.Config{Spec: spec})
		if !errors.Is(err, jupyter.ErrStartFailed) || !errors.Is(err, jupyter.ErrStartTimeout) {
			t.Fatalf("err = %v, want ErrStartFailed and ErrStartTimeout", err)
		}
	})
}

func TestStartShutdownCyclesLeakNothing(t *testing.T) {
	spec := testkernels.Spec(t, "python3")
	prov := &Provisioner{RuntimeDir: t.TempDir()}
	run := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		k, err := jupyter.Start(ctx, prov, jupyter.Config{Spec: spec})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := k.Execute(ctx, "1+1", nil); err != nil {
			t.Fatal(err)
		}
		k.Shutdown(ctx)
	}
	run() // warm up lazily started runtime goroutines and caches
	before := snapshot(t)
	for i := 0; i < 20; i++ {
		run()
	}
	checkNoLeaks(t, before)
	entries, _ := os.ReadDir(prov.RuntimeDir)
	if len(entries) != 0 {
		t.Errorf("runtime dir still holds %d entries", len(entries))
	}
}

// A shutdown whose context has already ended (a client that went away, a
// gateway past its shutdown grace) kills a kernel that ignores SIGTERM
// while it runs code, and still reaps it and removes what it left.
func TestShutdownWithCancelledContextEnds(t *testing.T) {
	runtime := t.TempDir()
	sctx, scancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer scancel()
	k, err := jupyter.Start(sctx, &Provisioner{RuntimeDir: runtime}, jupyter.Config{Spec: testkernels.Spec(t, "python3")})
	if err != nil {
		t.Fatal(err)
	}
	col := newCollector()
	if _, err := k.StartExecute(jupyter.NewExecute("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\nwhile True: time.sleep(.5)"), col.handle); err != nil {
		t.Fatal(err)
	}
	col.await(t, jupyter.StreamMsg, 30*time.Second)
	pid := k.PID()

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan struct{})
	go func() {
		k.Shutdown(ctx)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("Shutdown with an ended context did not return; kernel process %d alive: %v", pid, syscall.Kill(pid, 0) == nil)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("kernel process %d still exists after Shutdown", pid)
	}
	if left, _ := os.ReadDir(runtime); len(left) > 0 {
		t.Errorf("Shutdown left %d entries in the runtime directory, e.g. %s", len(left), left[0].Name())
	}
}

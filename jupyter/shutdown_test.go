package jupyter

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/testkernels"
)

// A shutdown whose context has already ended (a client that went away, a
// gateway past its shutdown grace) kills a kernel that ignores SIGTERM
// while it runs code, and still reaps it and removes what it left.
func TestShutdownWithCancelledContextEnds(t *testing.T) {
	runtime := t.TempDir()
	sctx, scancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer scancel()
	k, err := Start(sctx, &LocalProvisioner{RuntimeDir: runtime}, Config{Spec: testkernels.Spec(t, "python3")})
	if err != nil {
		t.Fatal(err)
	}
	col := newCollector()
	if _, err := k.StartExecute(NewExecute("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\nwhile True: time.sleep(.5)"), col.handle); err != nil {
		t.Fatal(err)
	}
	col.await(t, StreamMsg, 30*time.Second)
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

// ipykernel never answers an execute_request whose code holds a NUL: it
// goes idle for it and waits for the next request. The request fails
// with ErrRequestDropped within seconds, and the kernel runs on with its
// state.
func TestDroppedRequestFailsKeepingTheKernel(t *testing.T) {
	k := startKernel(t, "python3")
	if reply, _ := execute(t, k, "x = 41"); replyOf(t, reply).Status != "ok" {
		t.Fatalf("x = 41: %+v", replyOf(t, reply))
	}
	col := newCollector()
	c, err := k.StartExecute(NewExecute("y = \"a\x00b\""), col.handle)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("a request the kernel dropped never ended")
	}
	if _, err := c.Result(); !errors.Is(err, ErrRequestDropped) {
		t.Fatalf("dropped request: err %v, want ErrRequestDropped", err)
	}
	reply, out := execute(t, k, "print(x + 1)")
	if replyOf(t, reply).Status != "ok" {
		t.Fatalf("the kernel after the dropped request: %+v", replyOf(t, reply))
	}
	if s := contentOf(t, out.await(t, StreamMsg, time.Second)); s.Text != "42\n" {
		t.Errorf("the kernel lost its state: printed %q, want 42", s.Text)
	}
	if k.Err() != nil {
		t.Errorf("the kernel ended: %v", k.Err())
	}
}

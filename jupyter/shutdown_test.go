//go:build linux

package jupyter

import (
	"context"
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
	k, err := Start(sctx, &execProvisioner{dir: runtime}, Config{Spec: testkernels.Spec(t, "python3")})
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

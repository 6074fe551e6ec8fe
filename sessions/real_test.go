package sessions

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"kernelgate/internal/testkernels"
	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
)

// newRealManager returns a manager of real kernels (python3 and deno from
// .kernels), closed when the test ends.
func newRealManager(t *testing.T, cfg Config) *Manager {
	t.Helper()
	testkernels.Spec(t, "python3")
	testkernels.Spec(t, "deno")
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	m := New(cfg, kernelspecs.Load([]string{testkernels.Dir(t)}), &jupyter.LocalProvisioner{RuntimeDir: dir}, nil)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		m.Close(ctx)
	})
	return m
}

// Deno sometimes replies to a throw before it publishes the error: the
// run still carries one error, in its events and its Execution.
func TestDenoThrowsCarryOneError(t *testing.T) {
	m := newRealManager(t, Config{})
	for i := 0; i < 60; i++ {
		r, e := run(t, m, ExecuteRequest{Code: "throw new Error('boom')", Language: "javascript"})
		if errs := errorEvents(t, r); len(errs) != 1 {
			t.Fatalf("throw %d: %d error events, want 1: %+v", i, len(errs), errs)
		}
		if e.Error == nil || e.Error.Value == "" || e.Process.Reason != Errored {
			t.Fatalf("throw %d: Execution error %+v, process %+v", i, e.Error, e.Process)
		}
	}
}

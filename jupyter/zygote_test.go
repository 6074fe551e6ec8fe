package jupyter

import (
	"context"
	"testing"
	"time"

	"kernelgate/internal/testkernels"
	"kernelgate/kernelspecs"
)

// forkSpec is the python3 kernelspec forked from a zygote that preloads
// numpy, pandas and matplotlib.
func forkSpec(t *testing.T) *kernelspecs.Spec {
	t.Helper()
	dir := testkernels.WithLauncher(t, testkernels.Dir(t), LauncherFork, testkernels.Preload)
	s, err := kernelspecs.Load([]string{dir}).Get("python3")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startForked starts a forked python3 kernel and checks it was forked.
func startForked(t *testing.T, prov *LocalProvisioner, cfg Config) *Kernel {
	t.Helper()
	if cfg.Spec == nil {
		cfg.Spec = forkSpec(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	k, err := Start(ctx, prov, cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { k.Shutdown(context.Background()) })
	if _, ok := k.proc.(*forkedProcess); !ok {
		t.Fatalf("kernel was not forked: %T", k.proc)
	}
	return k
}

func TestForkedKernelRuns(t *testing.T) {
	k := startForked(t, &LocalProvisioner{RuntimeDir: t.TempDir()}, Config{})
	if got := stdout(t, k, "import os; print(os.getppid() == int(os.environ['JPY_PARENT_PID']), os.getpgid(0) == os.getpid())"); got != "True True\n" {
		t.Errorf("parent and group: %q", got)
	}
}

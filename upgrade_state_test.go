//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"

	"kernelgate/jupyter"
	"kernelgate/state"
)

// TestKeptKernelOfEarlierVersionAdopted: a gateway of an earlier version
// kept its kernels' info with the local part under "local" (no "data").
// A gateway started on such a store adopts the kernel it kept, with its
// state, as it adopts its own.
func TestKeptKernelOfEarlierVersionAdopted(t *testing.T) {
	bin := buildBinary(t)
	dirs := newRestartDirs(t)
	g := dirs.start(t, bin, "--pool-size", "0", "--keep-kernels")
	var c ctxModel
	call(t, "POST", g.url+"api/contexts", map[string]any{"id": "agent", "language": "python"}, 201, &c)
	execute(t, g.url, "agent", "x = 41")
	if err := g.kill(t, syscall.SIGTERM); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, g.logs)
	}
	waitProcs(t, dirs.runtime, false, []int{*c.KernelProcessID})

	// Rewrite the kept kernel's info as the earlier version wrote it.
	rewriteKeptKernels(t, dirs.state, func(k state.Kernel, info jupyter.ProvisionerInfo) ([]byte, error) {
		if len(info.Data) == 0 {
			t.Fatalf("kernel %s: info %s", k.ID, k.ProvisionerInfo)
		}
		return json.Marshal(map[string]any{"provisioner": "local", "connection": info.Connection, "local": info.Data})
	})

	g2 := dirs.start(t, bin, "--pool-size", "0")
	if e := execute(t, g2.url, "agent", "import os\n(x, os.getpid())"); e.text() != fmt.Sprintf("(41, %d)", *c.KernelProcessID) {
		t.Fatalf("the context whose kernel an earlier version kept: %+v\n%s", e, g2.logs)
	}
}

// rewriteKeptKernels rewrites the provisioner info of every kernel kept
// in the store of stateDir (no gateway running on it) as rewrite says: as
// an earlier version of kernelgate wrote it.
func rewriteKeptKernels(t *testing.T, stateDir string, rewrite func(k state.Kernel, info jupyter.ProvisionerInfo) ([]byte, error)) {
	t.Helper()
	ctx := context.Background()
	store, err := state.Open(filepath.Join(stateDir, state.FileName), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rewritten := 0
	for _, k := range snap.Kernels {
		info, err := jupyter.UnmarshalProvisionerInfo(k.ProvisionerInfo)
		if err != nil {
			t.Fatal(err)
		}
		if k.ProvisionerInfo, err = rewrite(k, info); err != nil {
			t.Fatal(err)
		}
		if err := store.PutKernel(ctx, k); err != nil {
			t.Fatal(err)
		}
		rewritten++
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	if rewritten == 0 {
		t.Fatal("the store kept no kernel")
	}
}

package gateway

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kernelgate/internal/leakcheck"
	"kernelgate/internal/sysproc"
	"kernelgate/jupyter"
)

// A DELETE /api/kernels/{id} whose client goes away while the kernel
// ignores SIGTERM still ends: the kernel is killed, its cgroup and its
// directory are removed, and the gateway shuts down afterwards.
func TestDeleteWhoseClientLeavesFinishes(t *testing.T) {
	g := newGateway(t)
	model := g.startKernel("python3")
	ws := g.mustDial(model.ID, true)
	ws.execute("import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint(os.environ['HOME'], flush=True)\nwhile True: time.sleep(.5)", false)
	var home string
	ws.until(30*time.Second, func(m wsMsg) bool {
		if m.Header.MsgType == jupyter.StreamMsg {
			home = strings.TrimSpace(m.text(t))
			return true
		}
		return false
	})
	k, err := g.mgr.Kernel(model.ID)
	if err != nil {
		t.Fatal(err)
	}
	pid := k.PID()
	kernelDir := filepath.Dir(filepath.Dir(home)) // <runtime>/kernel-*/kernel/home
	cgroups := leakcheck.KernelgateCgroups(t, pid)
	if _, err := os.Stat(kernelDir); err != nil {
		t.Fatalf("kernel directory %s: %v", kernelDir, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "DELETE", g.url+"/api/kernels/"+model.ID, nil)
	req.Header.Set("Authorization", "token "+g.token)
	sent := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		sent <- err
	}()
	// The kernel leaves the list once its deletion has begun: then the
	// client goes away.
	pollUntil(t, 30*time.Second, "the kernel to leave the list", func() bool {
		status, _ := g.do("GET", "/api/kernels/"+model.ID, nil)
		return status == http.StatusNotFound
	})
	cancel()
	<-sent

	pollUntil(t, 30*time.Second, "the kernel process to end", func() bool { return sysproc.Kill(pid, 0) != nil })
	pollUntil(t, 30*time.Second, "the kernel's directory and cgroups to be removed", func() bool {
		for _, dir := range append(cgroups, kernelDir) {
			if _, err := os.Stat(dir); err == nil {
				return false
			}
		}
		return true
	})

	closed := make(chan struct{})
	go func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		g.srv.Shutdown(sctx)
		g.mgr.Close(sctx)
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(40 * time.Second):
		t.Fatal("the gateway did not shut down after the deletion")
	}
}

// pollUntil polls cond until it holds, failing the test after d.
func pollUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("waited %v for %s", d, what)
		}
	}
}

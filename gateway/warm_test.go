package gateway

import (
	"strings"
	"testing"
	"time"

	"kernelgate/sessions"
)

// TestContextFromWarmPool: POST /api/contexts answers with the pooled
// kernel it took, under the kernel's own id (the one GET /api/kernels and
// the kernel's connection file name), and the metrics count it as a hit.
func TestContextFromWarmPool(t *testing.T) {
	g := newGateway(t, func(m *sessions.Config, _ *Config) { m.PoolSize = 1 })
	if err := g.mgr.WarmPools().Prewarm([]string{"python"}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, time.Minute, "the pool to fill", func() bool {
		ps := g.mgr.WarmPools().Stats()
		return len(ps) == 1 && ps[0].Ready == 1
	})
	c := b4Context(t, g, map[string]any{"id": "warm", "cwd": "work", "env": map[string]string{"REGION": "east"}})
	if c.KernelID == nil {
		t.Fatalf("context without a kernel: %+v", c)
	}
	if ps := g.mgr.WarmPools().Stats()[0]; ps.Hits != 1 {
		t.Errorf("pool %+v: the context did not take the ready kernel", ps)
	}
	e := mustRun(t, g, map[string]any{"context": "warm", "code": "import os, sys; print(os.getcwd(), os.environ['REGION'], os.path.basename(sys.argv[-1]))"})
	want := c.Cwd + " east kernel-" + *c.KernelID + ".json"
	if got := strings.TrimSpace(stdoutOf(e)); got != want {
		t.Errorf("the context's kernel says %q, want %q", got, want)
	}
	_, out := g.do("GET", "/api/kernels/"+*c.KernelID, nil)
	if !strings.Contains(string(out), *c.KernelID) {
		t.Errorf("GET /api/kernels/%s: %s", *c.KernelID, out)
	}
	_, metrics := g.do("GET", "/metrics", nil)
	if !strings.Contains(string(metrics), `kernelgate_pool_takes_total{result="hit",spec="python3"} 1`) {
		t.Errorf("metrics do not count the take as a hit")
	}
}

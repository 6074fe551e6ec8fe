//go:build linux

package jupyter

import (
	"context"
	"strings"
	"testing"
	"time"
)

// startWith starts a kernel with prov and cfg and shuts it down when the
// test ends.
func startWith(t *testing.T, prov Provisioner, cfg Config) *Kernel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	k, err := Start(ctx, prov, cfg)
	if err != nil {
		t.Fatalf("start %s: %v", cfg.Spec.Name, err)
	}
	t.Cleanup(func() { k.Shutdown(context.Background()) })
	return k
}

// streams is the stream output c collected.
func streams(c *collector) string {
	var b strings.Builder
	for _, m := range c.ofType(StreamMsg) {
		var s bundle
		if m.DecodeContent(&s) == nil {
			b.WriteString(s.Text)
		}
	}
	return b.String()
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll(within, cond) {
		t.Fatalf("%s: not within %v", what, within)
	}
}

// poll calls cond until it holds (true) or within has passed (false): for
// what has no event to wait on, such as /proc.
func poll(within time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			return cond()
		}
	}
	return true
}

//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// bigOutputLimits is what a kernelgate with default settings keeps of
// output at once: a run's logs (--max-log-bytes), the replay buffer and
// the largest stream message it holds while cutting one.
const bigOutputLimits = (8 + 8 + 8) << 20

// bigOutputPatterns print 1 GiB from Python in the ways that reach the
// gateway differently: many stream messages, a few huge ones, one of a
// gigabyte, and a message of 1024 frames.
var bigOutputPatterns = []struct{ name, code string }{
	{"flushed 1 MiB lines", "_l = 'y' * (1 << 20)\nfor _i in range(1024): print(_l, flush=True)\ndel _l, _i"},
	{"unflushed prints", "for _i in range(1024): print('y' * (1 << 20))\ndel _i"},
	{"one write", "import sys\nsys.stdout.write('y' * (1 << 30))"},
	{"1024 frames", "_k = get_ipython().kernel\n" +
		"_k.session.send(_k.iopub_socket, 'display_data', {'data': {'text/plain': 'frames'}, 'metadata': {}}, parent=_k.get_parent(), buffers=[b'y' * (1 << 20)] * 1024)\ndel _k"},
}

// benchBigOutput prints 1 GiB in each pattern through POST /api/execute
// in a context of its own, and measures the time of the run and the
// gateway's peak RSS growth (VmHWM, reset before each run). The run must
// complete truncated and the context keep its variables.
func (b *bench) benchBigOutput(ctx context.Context) error {
	met := true
	worst := int64(0)
	for _, p := range bigOutputPatterns {
		sctx, cancel := within(ctx, 10*time.Minute)
		err := func() error {
			id, _, err := b.kg.createContext(sctx, "python")
			if err != nil {
				return err
			}
			defer b.kg.deleteContext(context.Background(), id)
			if _, err := b.kg.execute(sctx, map[string]any{"code": "survivor = 1", "context": id}, ""); err != nil {
				return err
			}
			pid := b.kg.pid()
			if err := resetPeak(pid); err != nil {
				return fmt.Errorf("resetting the gateway's peak RSS: %w", err)
			}
			rss0, _, _ := memStatus(pid)
			progress("1 GiB of output, %s", p.name)
			var e struct {
				Truncated bool `json:"truncated"`
				Process   struct {
					Reason string `json:"reason"`
				} `json:"process"`
			}
			took, err := measure(func() error {
				status, out, err := b.kg.do(sctx, "POST", "api/execute", map[string]any{"code": p.code, "context": id})
				if err == nil && status != http.StatusOK {
					err = fmt.Errorf("POST /api/execute: status %d: %.300s", status, out)
				}
				if err == nil {
					err = json.Unmarshal(out, &e)
				}
				return err
			})
			if err != nil {
				return err
			}
			_, hwm, _ := memStatus(pid)
			kept := e.Process.Reason == "completed" && e.Truncated
			if _, err := b.kg.execute(sctx, map[string]any{"code": "survivor", "context": id}, "1"); err != nil {
				kept = false
				progress("the context lost its state: %v", err)
			}
			grew := hwm - rss0
			worst = max(worst, grew)
			met = met && kept && grew < bigOutputLimits+64<<20
			state := "run completed, truncated, state kept"
			if !kept {
				state = fmt.Sprintf("run %s, truncated %v: NOT KEPT", e.Process.Reason, e.Truncated)
			}
			b.add(row{figure: "1 GiB of output, " + p.name + ", python3 (REST)",
				kg: fmt.Sprintf("%s s; peak RSS +%.0f MiB (%.0f MiB before)", secs(took), mib(grew), mib(rss0)), ratios: state})
			return nil
		}()
		cancel()
		if err != nil {
			return err
		}
	}
	b.check("1 GB printed in any pattern keeps kernel, state and run (completed, truncated); gateway RSS growth under its limits + 64 MiB",
		met, "worst peak RSS growth %.0f MiB, bound %.0f MiB", mib(worst), mib(bigOutputLimits+64<<20))
	return nil
}

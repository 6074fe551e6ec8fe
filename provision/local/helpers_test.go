//go:build linux

package local

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"kernelgate/internal/leakcheck"
	"kernelgate/jupyter"
)

// Helpers of the tests that drive kernels through the local provisioner,
// as package jupyter's tests have them.

type resources = leakcheck.Resources

func snapshot(t *testing.T) resources { return leakcheck.Snapshot(t) }

func children() []int { return leakcheck.Children() }

func checkNoLeaks(t *testing.T, before resources) { leakcheck.Check(t, before) }

// pySleeping is Python code that says it runs, then waits to be
// interrupted. It sleeps in short steps: a SIGINT that lands after
// CPython last looked for signals and before the sleep's system call
// began is handled only when that call returns, so one long sleep would
// keep an interrupt sent as the code starts for its whole length (a
// window the tests, which interrupt at the first output, hit under load).
const pySleeping = "import time\nprint('sleeping', flush=True)\nwhile True:\n    time.sleep(0.05)"

// collector gathers the messages of one request, late ones included.
type collector struct {
	mu   sync.Mutex
	msgs []*jupyter.Message
	more chan struct{}
}

func newCollector() *collector { return &collector{more: make(chan struct{}, 1)} }

func (c *collector) handle(ch jupyter.Channel, m *jupyter.Message) {
	c.mu.Lock()
	c.msgs = append(c.msgs, m)
	c.mu.Unlock()
	select {
	case c.more <- struct{}{}:
	default:
	}
}

func (c *collector) ofType(t jupyter.MsgType) []*jupyter.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*jupyter.Message
	for _, m := range c.msgs {
		if m.Header.MsgType == t {
			out = append(out, m)
		}
	}
	return out
}

// await waits until a message of type t has arrived (it may come after the
// request completed) or fails the test at the deadline.
func (c *collector) await(t *testing.T, typ jupyter.MsgType, d time.Duration) *jupyter.Message {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		if ms := c.ofType(typ); len(ms) > 0 {
			return ms[0]
		}
		select {
		case <-c.more:
		case <-deadline.C:
			t.Fatalf("no %s within %v", typ, d)
		}
	}
}

func execute(t *testing.T, k *jupyter.Kernel, code string) (*jupyter.Message, *collector) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := newCollector()
	// Each test request stands alone: an earlier error must not abort it.
	content := jupyter.NewExecute(code)
	content.StopOnError = false
	call, err := k.StartExecute(content, c.handle)
	if err != nil {
		t.Fatalf("execute %q: %v", code, err)
	}
	reply, err := call.Wait(ctx)
	if err != nil {
		t.Fatalf("execute %q: %v", code, err)
	}
	return reply, c
}

type replyContent struct {
	Status         string `json:"status"`
	ExecutionCount int    `json:"execution_count"`
	EName          string `json:"ename"`
}

func replyOf(t *testing.T, m *jupyter.Message) replyContent {
	t.Helper()
	var r replyContent
	if err := m.DecodeContent(&r); err != nil {
		t.Fatal(err)
	}
	return r
}

type bundle struct {
	Data map[string]json.RawMessage `json:"data"`
	Name string                     `json:"name"`
	Text string                     `json:"text"`
	// error
	EName string `json:"ename"`
}

func contentOf(t *testing.T, m *jupyter.Message) bundle {
	t.Helper()
	var b bundle
	if err := m.DecodeContent(&b); err != nil {
		t.Fatal(err)
	}
	return b
}

func plainText(t *testing.T, b bundle) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(b.Data["text/plain"], &s); err != nil {
		t.Fatalf("text/plain: %v", err)
	}
	return stripANSI(s)
}

func stripANSI(s string) string {
	var out strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '[' {
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			i = j
			continue
		}
		out.WriteByte(s[i])
	}
	return out.String()
}

func keys(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

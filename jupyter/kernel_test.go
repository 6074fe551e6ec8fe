//go:build linux

package jupyter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/testkernels"
	"kernelgate/kernelspecs"
)

// pySleeping is Python code that says it runs, then waits to be
// interrupted. It sleeps in short steps: a SIGINT that lands after
// CPython last looked for signals and before the sleep's system call
// began is handled only when that call returns, so one long sleep would
// keep an interrupt sent as the code starts for its whole length (a
// window the tests, which interrupt at the first output, hit under load).
const pySleeping = "import time\nprint('sleeping', flush=True)\nwhile True:\n    time.sleep(0.05)"

// startKernel starts the named real kernel and shuts it down when the test ends.
func startKernel(t *testing.T, name string) *Kernel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	k, err := Start(ctx, testProvisioner(t), Config{Spec: testkernels.Spec(t, name)})
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() { k.Shutdown(context.Background()) })
	return k
}

// collector gathers the messages of one request, late ones included.
type collector struct {
	mu   sync.Mutex
	msgs []*Message
	more chan struct{}
}

func newCollector() *collector { return &collector{more: make(chan struct{}, 1)} }

func (c *collector) handle(ch Channel, m *Message) {
	c.mu.Lock()
	c.msgs = append(c.msgs, m)
	c.mu.Unlock()
	select {
	case c.more <- struct{}{}:
	default:
	}
}

func (c *collector) ofType(t MsgType) []*Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*Message
	for _, m := range c.msgs {
		if m.Header.MsgType == t {
			out = append(out, m)
		}
	}
	return out
}

// await waits until a message of type t has arrived (it may come after the
// request completed) or fails the test at the deadline.
func (c *collector) await(t *testing.T, typ MsgType, d time.Duration) *Message {
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

func execute(t *testing.T, k *Kernel, code string) (*Message, *collector) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := newCollector()
	// Each test request stands alone: an earlier error must not abort it.
	content := NewExecute(code)
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

func replyOf(t *testing.T, m *Message) replyContent {
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

func contentOf(t *testing.T, m *Message) bundle {
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

func TestPython(t *testing.T) {
	k := startKernel(t, "python3")
	if k.Info().LanguageInfo.Name != "python" {
		t.Errorf("language = %q, want python", k.Info().LanguageInfo.Name)
	}
	t.Run("result", func(t *testing.T) {
		reply, c := execute(t, k, "1+1")
		if r := replyOf(t, reply); r.Status != "ok" {
			t.Fatalf("reply status %q", r.Status)
		}
		if got := plainText(t, contentOf(t, c.await(t, ExecuteResult, time.Second))); got != "2" {
			t.Errorf("1+1 = %q, want 2", got)
		}
	})
	t.Run("stdout", func(t *testing.T) {
		_, c := execute(t, k, "print('hello')")
		s := contentOf(t, c.await(t, StreamMsg, time.Second))
		if s.Name != "stdout" || s.Text != "hello\n" {
			t.Errorf("stream = %q %q, want stdout hello", s.Name, s.Text)
		}
	})
	t.Run("error", func(t *testing.T) {
		reply, c := execute(t, k, "1/0")
		if r := replyOf(t, reply); r.Status != "error" || r.EName != "ZeroDivisionError" {
			t.Errorf("reply = %+v, want error ZeroDivisionError", r)
		}
		if e := contentOf(t, c.await(t, ErrorMsg, time.Second)); e.EName != "ZeroDivisionError" {
			t.Errorf("iopub error ename = %q", e.EName)
		}
	})
	t.Run("state persists", func(t *testing.T) {
		execute(t, k, "survivor = 41")
		_, c := execute(t, k, "survivor + 1")
		if got := plainText(t, contentOf(t, c.await(t, ExecuteResult, time.Second))); got != "42" {
			t.Errorf("got %q, want 42", got)
		}
	})
	t.Run("matplotlib png", func(t *testing.T) {
		_, c := execute(t, k, "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
		d := contentOf(t, c.await(t, DisplayData, time.Second))
		if len(d.Data["image/png"]) < 100 {
			t.Errorf("display_data has no image/png: keys %v", keys(d.Data))
		}
	})
	t.Run("pandas html and text", func(t *testing.T) {
		_, c := execute(t, k, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
		d := contentOf(t, c.await(t, ExecuteResult, time.Second))
		if d.Data["text/html"] == nil || d.Data["text/plain"] == nil {
			t.Errorf("DataFrame bundle keys = %v, want text/html and text/plain", keys(d.Data))
		}
	})
	t.Run("many messages in order", func(t *testing.T) {
		const n = 2000
		_, c := execute(t, k, fmt.Sprintf("for i in range(%d): display(i)", n))
		ds := c.ofType(DisplayData)
		if len(ds) != n {
			t.Fatalf("got %d display_data, want %d", len(ds), n)
		}
		for i, d := range ds {
			if got := plainText(t, contentOf(t, d)); got != fmt.Sprint(i) {
				t.Fatalf("display %d = %q: out of order", i, got)
			}
		}
	})
	t.Run("heartbeat", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := k.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func keys(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestDeno(t *testing.T) {
	k := startKernel(t, "deno")
	t.Run("state across requests", func(t *testing.T) {
		execute(t, k, "let a = 5")
		_, c := execute(t, k, "a * 2")
		// Deno may publish the result just after its idle status: it still arrives.
		if got := plainText(t, contentOf(t, c.await(t, ExecuteResult, 2*time.Second))); got != "10" {
			t.Errorf("a * 2 = %q, want 10", got)
		}
	})
	t.Run("typescript", func(t *testing.T) {
		_, c := execute(t, k, "interface P { x: number }\nconst p: P = { x: 3 };\np.x + 1")
		if got := plainText(t, contentOf(t, c.await(t, ExecuteResult, 2*time.Second))); got != "4" {
			t.Errorf("got %q, want 4", got)
		}
	})
	t.Run("error", func(t *testing.T) {
		reply, c := execute(t, k, "throw new Error('boom')")
		if r := replyOf(t, reply); r.Status != "error" {
			t.Errorf("reply status = %q, want error", r.Status)
		}
		if e := contentOf(t, c.await(t, ErrorMsg, time.Second)); e.EName != "Error" {
			t.Errorf("ename = %q, want Error", e.EName)
		}
	})
	t.Run("top-level await", func(t *testing.T) {
		_, c := execute(t, k, "await new Promise((r) => setTimeout(() => r(7), 10))")
		if got := plainText(t, contentOf(t, c.await(t, ExecuteResult, 2*time.Second))); got != "7" {
			t.Errorf("got %q, want 7", got)
		}
	})
	t.Run("late results are delivered", func(t *testing.T) {
		for i := 0; i < 200; i++ {
			_, c := execute(t, k, fmt.Sprintf("%d + 1", i))
			if got := plainText(t, contentOf(t, c.await(t, ExecuteResult, 2*time.Second))); got != fmt.Sprint(i+1) {
				t.Fatalf("run %d: got %q", i, got)
			}
		}
	})
}

func TestInterrupt(t *testing.T) {
	cases := []struct {
		kernel, setup, check, want, block string
		// running is the message that shows the code runs: ipykernel
		// ignores SIGINT until the code has started. Without one, the
		// code writes to a FIFO of the test (block has a %q for its path)
		// right before it spins: Deno's execute_input comes before the
		// code runs, and an interrupt that arrives in between is lost.
		running MsgType
	}{
		{"python3", "kept = 'yes'", "kept", "'yes'", pySleeping, StreamMsg},
		{"deno", "const kept = 'yes'", "kept", `"yes"`, "Deno.writeTextFileSync(%q, 'x'); while (true) {}", ""},
	}
	for _, c := range cases {
		t.Run(c.kernel, func(t *testing.T) {
			k := startKernel(t, c.kernel)
			execute(t, k, c.setup)
			col := newCollector()
			// With stop_on_error, ipykernel aborts a request that reaches
			// it while it finishes the interrupted one's error reply; the
			// check below is sent as soon as that reply is in.
			code, started := c.block, make(chan error, 1)
			if c.running == "" {
				fifo := filepath.Join(t.TempDir(), "started")
				if err := syscall.Mkfifo(fifo, 0o600); err != nil {
					t.Fatal(err)
				}
				code = fmt.Sprintf(c.block, fifo)
				go func() {
					f, err := os.Open(fifo) // until the code opens it to write
					if err == nil {
						_, err = f.Read(make([]byte, 1))
						f.Close()
					}
					started <- err
				}()
				// A reader still waiting for a writer is let go.
				defer func() {
					if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
						f.Close()
					}
				}()
			}
			block := NewExecute(code)
			block.StopOnError = false
			call, err := k.StartExecute(block, col.handle)
			if err != nil {
				t.Fatal(err)
			}
			if c.running != "" {
				col.await(t, c.running, 10*time.Second)
			} else {
				select {
				case err := <-started:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the code did not start")
				}
			}
			t0 := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := k.Interrupt(ctx); err != nil {
				t.Fatal(err)
			}
			reply, err := call.Wait(ctx)
			if err != nil {
				var seen []string
				for _, m := range col.msgs {
					seen = append(seen, string(m.Header.MsgType)+":"+string(m.RawContent))
				}
				t.Fatalf("%v; got %v; kernel output: %s", err, seen, k.Output())
			}
			if took := time.Since(t0); took > 2*time.Second {
				t.Errorf("interrupt took %v, want under 2s", took)
			}
			if r := replyOf(t, reply); r.Status != "error" {
				t.Errorf("interrupted reply status = %q, want error", r.Status)
			}
			_, after := execute(t, k, c.check)
			if got := plainText(t, contentOf(t, after.await(t, ExecuteResult, 2*time.Second))); got != c.want {
				t.Errorf("state after interrupt: got %q, want %q", got, c.want)
			}
		})
	}
}

func TestKilledKernelFailsRequest(t *testing.T) {
	k := startKernel(t, "python3")
	col := newCollector()
	call, err := k.StartExecute(NewExecute("import time; time.sleep(30)"), col.handle)
	if err != nil {
		t.Fatal(err)
	}
	col.await(t, ExecuteInput, 10*time.Second)
	t0 := time.Now()
	if err := syscall.Kill(k.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = call.Wait(ctx)
	if took := time.Since(t0); took > time.Second {
		t.Errorf("death noticed after %v, want within 1s", took)
	}
	var died *DiedError
	if !errors.Is(err, ErrKernelDied) || !errors.As(err, &died) {
		t.Fatalf("err = %v, want a DiedError", err)
	}
	if !strings.Contains(died.Status, "killed") {
		t.Errorf("status = %q, want it to say killed", died.Status)
	}
	if _, err := k.StartExecute(NewExecute("1"), nil); !errors.Is(err, ErrKernelDied) {
		t.Errorf("request after death: err = %v, want ErrKernelDied", err)
	}
}

func TestStartFailures(t *testing.T) {
	dir := t.TempDir()
	write := func(name, argv string) *kernelspecs.Spec {
		d := filepath.Join(dir, name)
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "kernel.json"), []byte(`{"argv": `+argv+`, "display_name": "x", "language": "python"}`), 0o644)
		s, err := kernelspecs.Parse(d)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	cases := []struct {
		name string
		spec *kernelspecs.Spec
		want []string
	}{
		{"exits at once", write("exits", `["/usr/bin/python3", "-c", "import sys; print('no-such-kernel-module', file=sys.stderr); sys.exit(3)"]`), []string{"exit status 3", "no-such-kernel-module"}},
		{"bad path", write("badpath", `["/nonexistent/kernel", "{connection_file}"]`), []string{"/nonexistent/kernel"}},
		{"missing module", write("nomodule", `["/usr/bin/python3", "-m", "no_such_kernel_xyz", "-f", "{connection_file}"]`), []string{"No module named no_such_kernel_xyz"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			t0 := time.Now()
			_, err := Start(ctx, testProvisioner(t), Config{Spec: c.spec})
			if !errors.Is(err, ErrStartFailed) {
				t.Fatalf("err = %v, want ErrStartFailed", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if took := time.Since(t0); took > 5*time.Second {
				t.Errorf("failing start took %v", took)
			}
		})
	}
	t.Run("never ready", func(t *testing.T) {
		spec := write("sleeper", `["/bin/sleep", "60"]`)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := Start(ctx, testProvisioner(t), Config{Spec: spec})
		if !errors.Is(err, ErrStartFailed) || !errors.Is(err, ErrStartTimeout) {
			t.Fatalf("err = %v, want ErrStartFailed and ErrStartTimeout", err)
		}
	})
}

func TestRestartGivesFreshState(t *testing.T) {
	k := startKernel(t, "python3")
	execute(t, k, "x = 1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	old := k.PID()
	k2, err := k.Restart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k2.Shutdown(context.Background()) })
	if k2.PID() == old || k2.ID() != k.ID() {
		t.Errorf("restart: pid %d→%d id %s→%s, want a new process with the same id", old, k2.PID(), k.ID(), k2.ID())
	}
	if !errors.Is(k.Err(), ErrKernelShutdown) {
		t.Errorf("old kernel err = %v", k.Err())
	}
	reply, _ := execute(t, k2, "x")
	if r := replyOf(t, reply); r.EName != "NameError" {
		t.Errorf("x after restart: %+v, want NameError", r)
	}
}

func TestStartShutdownCyclesLeakNothing(t *testing.T) {
	spec := testkernels.Spec(t, "python3")
	prov := testProvisioner(t)
	run := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		k, err := Start(ctx, prov, Config{Spec: spec})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := k.Execute(ctx, "1+1", nil); err != nil {
			t.Fatal(err)
		}
		k.Shutdown(ctx)
	}
	run() // warm up lazily started runtime goroutines and caches
	before := snapshot(t)
	for i := 0; i < 20; i++ {
		run()
	}
	checkNoLeaks(t, before)
	entries, _ := os.ReadDir(prov.dir)
	if len(entries) != 0 {
		t.Errorf("runtime dir still holds %d entries", len(entries))
	}
}

// A call ends only once the handlers of both its reply and its idle status
// have returned, whichever of the two readers gets its message first: a
// caller reads what the handler made of the reply as soon as Done closes.
func TestCallEndsAfterItsHandlers(t *testing.T) {
	k := startKernel(t, "python3")
	for i := range 5 {
		replyIn := make(chan struct{})
		release := make(chan struct{})
		unblock := sync.OnceFunc(func() { close(release) })
		defer unblock() // a failure must not leave the reader blocked
		idleSeen := make(chan struct{})
		var handledReply atomic.Bool
		h := func(ch Channel, m *Message) {
			switch {
			case m.Header.MsgType == ExecuteReply:
				close(replyIn)
				<-release
				handledReply.Store(true)
			case isIdle(m):
				close(idleSeen)
			}
		}
		call, err := k.StartExecute(NewExecute("1+1"), h)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.After(30 * time.Second)
		for _, c := range []chan struct{}{replyIn, idleSeen} {
			select {
			case <-c:
			case <-deadline:
				t.Fatalf("run %d: no reply or no idle status", i)
			}
		}
		select {
		case <-call.Done():
			t.Fatalf("run %d: the call ended while its reply's handler was still running", i)
		default:
		}
		unblock()
		select {
		case <-call.Done():
		case <-deadline:
			t.Fatalf("run %d: the call did not end", i)
		}
		if !handledReply.Load() {
			t.Fatalf("run %d: ended before the reply was handled", i)
		}
	}
}

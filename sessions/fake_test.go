package sessions

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
	"kernelgate/runs"
)

// fakeKernels starts in-memory kernel processes for a Manager under test
// and keeps every one it started.
type fakeKernels struct {
	// script answers each shell request of a new kernel, in order, on the
	// kernel's one shell goroutine (nil: fakeAnswer).
	script func(r *fakeRequest)
	// impl is the kernel_info implementation name ("fake" when empty).
	impl string

	mu      sync.Mutex
	started []*fakeKernel
	// gate, when set, holds every start until it is closed (a slow start).
	gate chan struct{}
	// sent, when set, runs in Request once the request is sent, before
	// Request returns (a caller slow to go on after sending).
	sent func(m *Message)
}

func (f *fakeKernels) start(ctx context.Context, cfg jupyter.Config) (process, error) {
	f.mu.Lock()
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	k := &fakeKernel{
		cfg: cfg, script: f.script, impl: f.impl, sent: f.sent,
		pending:    map[string]*fakeCall{},
		recent:     map[string]*fakeCall{},
		shell:      make(chan *fakeRequest, 1024),
		stdin:      make(chan *Message, 16),
		interrupts: make(chan struct{}, 16),
		done:       make(chan struct{}),
		vars:       map[string]string{},
	}
	if k.script == nil {
		k.script = fakeAnswer
	}
	if k.impl == "" {
		k.impl = "fake"
	}
	k.wg.Add(1)
	go k.serve()
	f.mu.Lock()
	f.started = append(f.started, k)
	f.mu.Unlock()
	return k, nil
}

// kernels returns the kernels started so far.
func (f *fakeKernels) kernels() []*fakeKernel {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*fakeKernel(nil), f.started...)
}

// fakeKernel is one fake kernel process: a shell goroutine runs the
// script on each request; iopub messages go to the subscriber first, then
// to the request they answer, as jupyter.Kernel routes them.
type fakeKernel struct {
	cfg    jupyter.Config
	script func(r *fakeRequest)
	sent   func(m *Message)
	impl   string

	shell      chan *fakeRequest
	stdin      chan *Message
	interrupts chan struct{}
	done       chan struct{}
	wg         sync.WaitGroup

	mu      sync.Mutex
	pending map[string]*fakeCall
	recent  map[string]*fakeCall // finished calls, for late messages
	err     error
	count   int
	vars    map[string]string // what "name = value" code set
}

var _ process = (*fakeKernel)(nil)

type fakeCall struct {
	id      string
	h       jupyter.Handler
	opts    jupyter.CallOptions
	reply   *Message
	idle    bool
	err     error
	done    chan struct{}
	settled bool
}

func (c *fakeCall) Done() <-chan struct{} { return c.done }
func (c *fakeCall) Result() (*Message, error) {
	<-c.done
	return c.reply, c.err
}
func (c *fakeCall) Wait(ctx context.Context) (*Message, error) {
	select {
	case <-c.done:
		return c.reply, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (k *fakeKernel) PID() int { return 0 }
func (k *fakeKernel) Info() jupyter.KernelInfo {
	return jupyter.KernelInfo{Implementation: k.impl}
}
func (k *fakeKernel) Done() <-chan struct{} { return k.done }
func (k *fakeKernel) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}
func (k *fakeKernel) NewMessage(t MsgType, content any, parent *Message) (*Message, error) {
	return jupyter.NewMessage("fake-client", t, content, parent)
}

func (k *fakeKernel) Send(ch Channel, m *Message) error {
	if err := k.Err(); err != nil {
		return err
	}
	switch ch {
	case Stdin:
		select {
		case k.stdin <- m:
		default:
		}
	case Shell, Control:
		k.shell <- &fakeRequest{k: k, Msg: m}
	}
	return nil
}

func (k *fakeKernel) Request(ch Channel, m *Message, h jupyter.Handler, opts jupyter.CallOptions) (runs.Call, error) {
	c := &fakeCall{id: m.Header.MsgID, h: h, opts: opts, done: make(chan struct{})}
	k.mu.Lock()
	if k.err != nil {
		err := k.err
		k.mu.Unlock()
		return nil, err
	}
	if k.pending[c.id] != nil { // as jupyter's client refuses it
		k.mu.Unlock()
		return nil, fmt.Errorf("%w: msg_id %s is already awaiting a reply", jupyter.ErrDuplicateRequest, c.id)
	}
	k.pending[c.id] = c
	k.mu.Unlock()
	if err := k.Send(ch, m); err != nil {
		return c, err
	}
	if k.sent != nil {
		k.sent(m)
	}
	return c, nil
}

func (k *fakeKernel) Forget(c runs.Call) {
	fc, _ := c.(*fakeCall)
	k.mu.Lock()
	if fc != nil && k.pending[fc.id] == fc {
		delete(k.pending, fc.id)
	}
	k.mu.Unlock()
}

func (k *fakeKernel) Interrupt(ctx context.Context) error {
	if err := k.Err(); err != nil {
		return err
	}
	select {
	case k.interrupts <- struct{}{}:
	default:
	}
	return nil
}

func (k *fakeKernel) Shutdown(ctx context.Context) error {
	k.die(jupyter.ErrKernelShutdown)
	k.wg.Wait()
	return nil
}

// die ends the process with err: pending calls fail, Done closes.
func (k *fakeKernel) die(err error) {
	k.mu.Lock()
	if k.err != nil {
		k.mu.Unlock()
		return
	}
	k.err = err
	calls := k.pending
	k.pending = map[string]*fakeCall{}
	for _, c := range calls {
		c.err, c.settled = err, true
	}
	k.mu.Unlock()
	for _, c := range calls {
		close(c.done)
	}
	close(k.done)
}

// crash is the process dying on its own (exit status 1).
func (k *fakeKernel) crash() { k.die(&jupyter.DiedError{Status: "exit status 1"}) }

func (k *fakeKernel) serve() {
	defer k.wg.Done()
	for {
		select {
		case r := <-k.shell:
			if r.silent() {
				// The gateway's own setup code (cwd, env, packages): the
				// tests' scripts answer user code only.
				r.Status(jupyter.StateBusy)
				r.Reply(map[string]any{"status": "ok"})
				r.Status(jupyter.StateIdle)
				continue
			}
			k.script(r)
		case <-k.done:
			return
		}
	}
}

// deliver routes m as jupyter.Kernel.dispatch does.
func (k *fakeKernel) deliver(ch Channel, m *Message) {
	if k.Err() != nil {
		return
	}
	if ch == IOPub && k.cfg.IOPub != nil {
		k.cfg.IOPub(m)
	}
	if m.ParentID == "" {
		return
	}
	k.mu.Lock()
	c := k.pending[m.ParentID]
	if c == nil {
		// Late messages still reach a call that has finished.
		c = k.recent[m.ParentID]
	}
	if c == nil || (ch == IOPub && !c.opts.IOPub) {
		k.mu.Unlock()
		return
	}
	k.mu.Unlock()
	if c.h != nil {
		c.h(ch, m)
	}
	k.mu.Lock()
	finish := false
	if k.pending[c.id] == c {
		switch {
		case ch == IOPub && m.Type() == jupyter.StatusMsg:
			c.idle = c.idle || m.ExecutionState() == jupyter.StateIdle
		case ch != IOPub && m.Type().IsReply():
			c.reply = m
		}
		if c.reply != nil && (c.idle || !c.opts.IOPub) {
			finish, c.settled = true, true
			delete(k.pending, c.id)
			if len(k.recent) >= 64 {
				clear(k.recent)
			}
			k.recent[c.id] = c
		}
	}
	k.mu.Unlock()
	if finish {
		close(c.done)
	}
}

// fakeRequest is one shell or control request, with what a script uses to
// answer it.
type fakeRequest struct {
	k   *fakeKernel
	Msg *Message
}

// silent reports a silent execute_request.
func (r *fakeRequest) silent() bool {
	var c struct{ Silent bool }
	return r.Msg.Type() == jupyter.ExecuteRequest && r.Msg.DecodeContent(&c) == nil && c.Silent
}

// Code is the code of an execute_request.
func (r *fakeRequest) Code() string {
	var c struct{ Code string }
	r.Msg.DecodeContent(&c)
	return c.Code
}

// IOPub publishes a message whose parent is the request.
func (r *fakeRequest) IOPub(t MsgType, content any) {
	m, _ := jupyter.NewMessage("fake-kernel", t, content, r.Msg)
	r.k.deliver(IOPub, m)
}

func (r *fakeRequest) Status(state jupyter.ExecutionState) {
	r.IOPub(jupyter.StatusMsg, map[string]string{"execution_state": string(state)})
}

func (r *fakeRequest) Stream(text string) {
	r.IOPub(jupyter.StreamMsg, map[string]string{"name": "stdout", "text": text})
}

func (r *fakeRequest) Result(text string) {
	r.IOPub(jupyter.ExecuteResult, map[string]any{"data": map[string]string{"text/plain": text}, "metadata": map[string]any{}, "execution_count": r.k.count})
}

func (r *fakeRequest) Error(ename, evalue string) {
	r.IOPub(jupyter.ErrorMsg, map[string]any{"ename": ename, "evalue": evalue, "traceback": []string{ename + ": " + evalue}})
}

// Reply sends the request's reply on shell.
func (r *fakeRequest) Reply(content map[string]any) {
	t := MsgType(strings.TrimSuffix(string(r.Msg.Type()), "_request") + "_reply")
	if _, ok := content["execution_count"]; !ok && r.Msg.Type() == jupyter.ExecuteRequest {
		content["execution_count"] = r.k.count
	}
	m, _ := jupyter.NewMessage("fake-kernel", t, content, r.Msg)
	r.k.deliver(Shell, m)
}

// fakeAnswer is the default script, a tiny language of one statement per
// request: "name = value" sets a variable, "name" shows its value (an
// execute_result, or a NameError), "print text" writes text, "raise" fails,
// "sleep" waits for an interrupt, "exit" replies and then ends the process.
// Anything else succeeds silently.
func fakeAnswer(r *fakeRequest) {
	if r.Msg.Type() != jupyter.ExecuteRequest {
		r.Status(jupyter.StateBusy)
		r.Reply(map[string]any{"status": "ok"})
		r.Status(jupyter.StateIdle)
		return
	}
	k := r.k
	k.mu.Lock()
	k.count++
	n := k.count
	k.mu.Unlock()
	r.Status(jupyter.StateBusy)
	code := strings.TrimSpace(r.Code())
	r.IOPub(jupyter.ExecuteInput, map[string]any{"code": code, "execution_count": n})
	fail := func(ename, evalue string) {
		r.Error(ename, evalue)
		r.Reply(map[string]any{"status": "error", "ename": ename, "evalue": evalue, "traceback": []string{}})
		r.Status(jupyter.StateIdle)
	}
	switch name, value, set := strings.Cut(code, "="); {
	case set:
		k.mu.Lock()
		k.vars[strings.TrimSpace(name)] = strings.TrimSpace(value)
		k.mu.Unlock()
	case strings.HasPrefix(code, "print "):
		r.Stream(strings.TrimPrefix(code, "print ") + "\n")
	case code == "raise":
		fail("ValueError", "raised")
		return
	case code == "sleep":
		select {
		case <-k.interrupts:
			fail("KeyboardInterrupt", "")
		case <-k.done:
		}
		return
	case code == "exit":
		r.Reply(map[string]any{"status": "ok"})
		r.Status(jupyter.StateIdle)
		k.crash()
		return
	case code != "":
		k.mu.Lock()
		v, ok := k.vars[code]
		k.mu.Unlock()
		if !ok {
			fail("NameError", "name '"+code+"' is not defined")
			return
		}
		r.Result(v)
	}
	r.Reply(map[string]any{"status": "ok"})
	r.Status(jupyter.StateIdle)
}

// fakeSpecs writes a kernelspec named "fake" for the language python,
// with metadata.kernelgate when given.
func fakeSpecs(t testing.TB, kernelgate ...string) *kernelspecs.Catalog {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "fake")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	md := ""
	if len(kernelgate) > 0 {
		md = `, "metadata": {"kernelgate": ` + kernelgate[0] + `}`
	}
	js := `{"argv": ["fake-kernel", "{connection_file}"], "display_name": "Fake", "language": "python"` + md + `}`
	if err := os.WriteFile(filepath.Join(dir, "kernel.json"), []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	cat := kernelspecs.Load([]string{filepath.Dir(dir)})
	if _, err := cat.Get("fake"); err != nil {
		t.Fatal(err)
	}
	return cat
}

// newFakeManager returns a manager whose kernels are fakes, closed when the
// test ends.
func newFakeManager(t testing.TB, cfg Config, f *fakeKernels) *Manager {
	t.Helper()
	return newFakeManagerWith(t, cfg, f, fakeSpecs(t))
}

// newFakeManagerWith is newFakeManager over the given kernelspecs.
func newFakeManagerWith(t testing.TB, cfg Config, f *fakeKernels, specs *kernelspecs.Catalog) *Manager {
	t.Helper()
	cfg.DefaultKernel = "fake"
	if cfg.Languages == nil {
		cfg.Languages = map[string]string{"python": "fake"}
	}
	m := New(cfg, specs, nil, nil)
	m.start = f.start
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// A deadlocked manager fails the test rather than hanging it.
		within(t, "Manager.Close", 15*time.Second, func() { m.Close(ctx) })
	})
	return m
}

// within runs fn and fails the test when it does not return in time (a
// deadlock), without waiting for it.
func within(t testing.TB, what string, d time.Duration, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v (deadlock?)", what, d)
	}
}

// waitFor polls cond until it holds, for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitWithin(t, 10*time.Second, what, cond)
}

// waitWithin polls cond until it holds or d has passed.
func waitWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(d)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

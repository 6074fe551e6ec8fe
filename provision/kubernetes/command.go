package kubernetes

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/utils/exec"

	"kernelgate/jupyter"
)

// A command beside a pod kernel runs in the kernel's pod, through the
// pods/exec subresource (a websocket, or SPDY from an API server that
// does not take one). Exec carries no signals, no working directory and
// no environment, so the command's argv is wrapped in a /bin/sh script
// that reads the environment from the first lines of stdin (never in
// the exec request's URL, which the API server may log), enters the
// folder, checks the program exists
// and puts the command in a process group of its own (setsid, unless the
// exec'd process leads one already). Its first line on stderr reports
// that group, marked with a token of the command's; the reader strips it.
// Interrupt and Kill exec `kill` on that group in the pod. The command
// ends with the pod (the runtime kills what runs in a container that
// ends; the stream is dropped when the gateway sees the pod go).

// commandScript is the wrapper: sh -c commandScript sh MARK DIR PATHFIRST
// ARGV..., with stdin the environment (envPreamble), then the command's
// input.
const commandScript = `m=$1 d=$2 p=$3
shift 3
while IFS= read -r l && [ -n "$l" ]; do v=$(printf '%bx' "${l#*=}"); export "${l%%=*}=${v%x}"; done
if [ -n "$p" ]; then PATH="$p${PATH:+:$PATH}"; export PATH; fi
if [ -n "$d" ] && ! cd "$d" 2>/dev/null; then echo "$m nodir" >&2; exit 126; fi
if ! command -v "$1" >/dev/null 2>&1; then echo "$m noprog" >&2; exit 127; fi
g=
if [ -r /proc/$$/stat ]; then read -r _ _ _ _ g _ </proc/$$/stat; fi
if [ "$g" = "$$" ]; then echo "$m pgid $$" >&2; exec "$@"; fi
if command -v setsid >/dev/null 2>&1; then exec setsid /bin/sh -c 'echo "$0 pgid $$" >&2; exec "$@"' "$m" "$@"; fi
echo "$m pid $$" >&2
exec "$@"`

// commandStartTimeout bounds how long a command's start waits for the
// wrapper's report.
const commandStartTimeout = time.Minute

// signalTimeout bounds the exec that signals a command.
const signalTimeout = 10 * time.Second

// commandLostWait is how long a command whose stream broke waits to learn
// whether its pod ended.
const commandLostWait = 2 * time.Second

var _ jupyter.CommandStarter = (*podProcess)(nil)

// StartCommand runs req in the kernel's pod and returns once the command
// runs (its process group known) or failed to start.
func (pp *podProcess) StartCommand(ctx context.Context, req jupyter.CommandRequest) (jupyter.Command, error) {
	select {
	case <-pp.done:
		return nil, fmt.Errorf("%w: the kernel's pod has ended", jupyter.ErrKernelDied)
	default:
	}
	if pp.p.Config == nil {
		return nil, jupyter.ErrNoCommands
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, errors.New("kubernetes-provisioner: a command needs a program")
	}
	for k, v := range req.Env {
		if !shellName(k) || strings.IndexByte(v, 0) >= 0 {
			return nil, fmt.Errorf("kubernetes-provisioner: %q is no environment variable a shell can set", k)
		}
	}
	mark := newMark()
	argv := append([]string{"/bin/sh", "-c", commandScript, "sh", mark, req.Dir, strings.Join(req.PathFirst, ":")}, req.Argv...)

	c := &podCommand{pp: pp, done: make(chan struct{}), report: make(chan string, 1)}
	var stdoutW, stderrW *io.PipeWriter
	c.stdout, stdoutW = io.Pipe()
	c.stderr, stderrW = io.Pipe()
	opts := remotecommand.StreamOptions{Stdout: stdoutW, Stderr: &markWriter{mark: mark + " ", w: stderrW, report: c.report}}
	opts.Stdin = bytes.NewReader(envPreamble(req.Env))
	if req.Stdin {
		c.stdin = newInputPipe()
		opts.Stdin = io.MultiReader(opts.Stdin, c.stdin)
	}
	ex, err := pp.p.executor(pp.name, argv, true)
	if err != nil {
		return nil, fmt.Errorf("kubernetes-provisioner: exec in pod %s: %w", pp.name, err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	go func() { // owned by the command: ends with its stream
		defer cancel()
		err := ex.StreamWithContext(sctx, opts)
		c.finish(err)
		stdoutW.Close()
		stderrW.Close()
	}()
	go func() { // the stream is dropped once the pod is gone
		select {
		case <-pp.done:
			cancel()
		case <-c.done:
		}
	}()

	var rep string
	timeout := time.NewTimer(commandStartTimeout)
	defer timeout.Stop()
	select {
	case rep = <-c.report:
	case <-c.done:
		select {
		case rep = <-c.report: // reported, then ended at once
		default:
			c.closeOutput()
			return nil, fmt.Errorf("kubernetes-provisioner: the command did not start in pod %s: %v", pp.name, c.err)
		}
	case <-ctx.Done():
		cancel()
		c.closeOutput() // first: a write to them fails rather than waits
		<-c.done
		return nil, ctx.Err()
	case <-timeout.C:
		cancel()
		c.closeOutput() // first: a write to them fails rather than waits
		<-c.done
		return nil, fmt.Errorf("kubernetes-provisioner: the command did not start in pod %s within %v", pp.name, commandStartTimeout)
	}
	kind, num, _ := strings.Cut(rep, " ")
	switch kind {
	case "pgid", "pid":
		n, err := strconv.Atoi(num)
		if err == nil && n > 0 {
			c.target = num
			if kind == "pgid" {
				c.target = "-" + num
			}
			return c, nil
		}
	case "noprog":
		c.closeOutput() // first: a write to them fails rather than waits
		<-c.done
		return nil, fmt.Errorf("%w: %s is not an executable on the kernel's PATH in pod %s", jupyter.ErrNoProgram, req.Argv[0], pp.name)
	case "nodir":
		c.closeOutput() // first: a write to them fails rather than waits
		<-c.done
		return nil, fmt.Errorf("kubernetes-provisioner: no folder %s in pod %s", req.Dir, pp.name)
	}
	// A shell that printed something else first: the command runs, but
	// cannot be signalled.
	return c, nil
}

// executor reaches pods/exec of the kernel's container: by websocket,
// or SPDY where the API server does not take one.
func (p *Provisioner) executor(pod string, argv []string, stdin bool) (remotecommand.Executor, error) {
	u := p.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(p.Namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: argv, Stdin: stdin, Stdout: true, Stderr: true}, scheme.ParameterCodec).URL()
	ws, err := remotecommand.NewWebSocketExecutor(p.Config, http.MethodGet, u.String())
	if err != nil {
		return nil, err
	}
	spdy, err := remotecommand.NewSPDYExecutor(p.Config, http.MethodPost, u)
	if err != nil {
		return nil, err
	}
	return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}

// envPreamble is env as the wrapper reads it: a line NAME=VALUE each,
// VALUE escaped for printf %b (backslash, newline and other control
// bytes), then an empty line.
func envPreamble(env map[string]string) []byte {
	var b bytes.Buffer
	for k, v := range env {
		b.WriteString(k)
		b.WriteByte('=')
		for i := 0; i < len(v); i++ {
			switch c := v[i]; {
			case c == '\\':
				b.WriteString(`\\`)
			case c == '\n':
				b.WriteString(`\n`)
			case c < 0x20 || c == 0x7f:
				fmt.Fprintf(&b, `\0%03o`, c)
			default:
				b.WriteByte(c)
			}
		}
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	return b.Bytes()
}

// shellName says whether k is a name sh can export.
func shellName(k string) bool {
	for i, c := range k {
		if c != '_' && (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return k != ""
}

func newMark() string {
	b := make([]byte, 12)
	rand.Read(b)
	return "kernelgate-command-" + hex.EncodeToString(b)
}

// podCommand is a command running in a kernel's pod.
type podCommand struct {
	pp     *podProcess
	stdout *io.PipeReader
	stderr *io.PipeReader
	stdin  *inputPipe
	report chan string // the wrapper's first line, without the mark
	target string      // what kill signals: -PGID, or the PID; "" unknown

	done chan struct{}
	code int   // set before done is closed
	err  error // the stream's error, set before done is closed
}

var _ jupyter.Command = (*podCommand)(nil)

// finish records how the stream ended and closes done.
func (c *podCommand) finish(err error) {
	var ee utilexec.ExitError
	switch {
	case err == nil:
		c.code = 0
	case errors.As(err, &ee):
		c.code = ee.ExitStatus()
	default:
		// The stream broke without an exit status: the pod went (which
		// kills what runs in it), or the API server or network failed.
		c.err = err
		c.code = 255
		t := time.NewTimer(commandLostWait)
		select {
		case <-c.pp.done:
			c.code = 128 + 9
		case <-t.C:
		}
		t.Stop()
	}
	if c.stdin != nil {
		c.stdin.finish()
	}
	close(c.done)
}

func (c *podCommand) closeOutput() {
	c.stdout.Close()
	c.stderr.Close()
}

func (c *podCommand) Stdout() io.ReadCloser { return c.stdout }
func (c *podCommand) Stderr() io.ReadCloser { return c.stderr }

func (c *podCommand) Stdin() jupyter.CommandInput {
	if c.stdin == nil {
		return nil
	}
	return c.stdin
}

func (c *podCommand) Done() <-chan struct{} { return c.done }

func (c *podCommand) ExitCode() int {
	<-c.done
	return c.code
}

func (c *podCommand) Interrupt() error { return c.signal("INT") }
func (c *podCommand) Kill() error      { return c.signal("KILL") }

// KilledWithKernel: SIGKILL ended the command and the kernel's pod ended.
func (c *podCommand) KilledWithKernel(wait time.Duration) bool {
	if c.ExitCode() != 128+9 {
		return false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-c.pp.done:
		return true
	case <-t.C:
		return false
	}
}

// signal execs kill in the pod for the command's process group.
func (c *podCommand) signal(sig string) error {
	select {
	case <-c.done:
		return os.ErrProcessDone
	default:
	}
	if c.target == "" {
		return fmt.Errorf("%w: the command's process is not known", jupyter.ErrNotSupported)
	}
	ex, err := c.pp.p.executor(c.pp.name, []string{"/bin/sh", "-c", "kill -s " + sig + " -- " + c.target}, false)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), signalTimeout)
	defer cancel()
	var out bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &out})
	if err == nil {
		return nil
	}
	select {
	case <-c.done:
		return os.ErrProcessDone
	default:
	}
	return fmt.Errorf("kubernetes-provisioner: kill -%s %s in pod %s: %v: %s", sig, c.target, c.pp.name, err, bytes.TrimSpace(out.Bytes()))
}

// markWriter passes a command's stderr on, but for its first line when
// that is the wrapper's report (mark, then what it reports), which goes
// to report. Nothing is reported when the first line is not one.
type markWriter struct {
	mark   string
	w      io.Writer
	report chan<- string
	head   []byte // the first line so far
	passed bool   // the first line is behind
}

func (m *markWriter) Write(b []byte) (int, error) {
	if m.passed {
		return m.w.Write(b)
	}
	n := len(b)
	m.head = append(m.head, b...)
	i := bytes.IndexByte(m.head, '\n')
	if i < 0 && len(m.head) < len(m.mark)+64 {
		return n, nil
	}
	m.passed = true
	rest := m.head
	if i >= 0 && bytes.HasPrefix(m.head, []byte(m.mark)) {
		m.report <- string(m.head[len(m.mark):i])
		rest = m.head[i+1:]
	} else {
		m.report <- ""
	}
	m.head = nil
	if len(rest) > 0 {
		if _, err := m.w.Write(rest); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// inputPipe is a command's stdin: what Write is given, Read hands to the
// exec stream. Writes take deadlines.
type inputPipe struct {
	data   chan []byte // a write's bytes, to the reader
	took   chan int    // how many the reader took
	closed chan struct{}
	gone   chan struct{} // the stream ended: writes fail

	closeOnce, goneOnce sync.Once

	mu       sync.Mutex
	deadline time.Time
	// One Read and one Write at a time, so took answers the write
	// whose bytes were taken.
	rmu, wmu sync.Mutex
}

func newInputPipe() *inputPipe {
	return &inputPipe{data: make(chan []byte), took: make(chan int), closed: make(chan struct{}), gone: make(chan struct{})}
}

var _ jupyter.CommandInput = (*inputPipe)(nil)

func (p *inputPipe) Read(b []byte) (int, error) {
	p.rmu.Lock()
	defer p.rmu.Unlock()
	select {
	case d := <-p.data:
		n := copy(b, d)
		p.took <- n
		return n, nil
	case <-p.closed:
		return 0, io.EOF
	case <-p.gone:
		return 0, io.EOF
	}
}

func (p *inputPipe) Write(b []byte) (int, error) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	p.mu.Lock()
	deadline := p.deadline
	p.mu.Unlock()
	var expired <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		expired = t.C
	}
	total := 0
	for len(b) > 0 {
		select {
		case p.data <- b:
			n := <-p.took
			b = b[n:]
			total += n
		case <-p.closed:
			return total, io.ErrClosedPipe
		case <-p.gone:
			return total, io.ErrClosedPipe
		case <-expired:
			return total, os.ErrDeadlineExceeded
		}
	}
	return total, nil
}

func (p *inputPipe) SetWriteDeadline(t time.Time) error {
	p.mu.Lock()
	p.deadline = t
	p.mu.Unlock()
	return nil
}

// Close ends the command's input: it reads EOF.
func (p *inputPipe) Close() error {
	p.closeOnce.Do(func() { close(p.closed) })
	return nil
}

func (p *inputPipe) finish() { p.goneOnce.Do(func() { close(p.gone) }) }

package sessions

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"kernelgate/jupyter"
	"kernelgate/runs"
)

// A command is a run of a process beside a context's kernel (see
// jupyter.CommandRequest): it never waits in the context's queue, its
// output is folded into an Execution as code output is (bounded the same
// way), and it ends with its exit code. Interrupt sends SIGINT, Kill
// SIGKILL to its process group, the timeout SIGKILL; deleting the context
// kills it.

// MaxCommandArgs bounds a command's argv.
const MaxCommandArgs = 4096

// commandReadSize is how much of a command's output one read takes.
const commandReadSize = 32 << 10

// stdinWriteWait bounds how long an input waits for a command that does
// not read its stdin.
const stdinWriteWait = 2 * time.Second

// CommandRequest is POST /api/contexts/{id}/commands.
type CommandRequest struct {
	// Context names the context; empty is the shared context of
	// Language or Kernelspec (POST /api/execute with kind "exec").
	Context    string
	Language   string
	Kernelspec string
	// Argv is the program and its arguments (see ShellCommand).
	Argv []string
	// Cwd is the working directory, relative to the context's workspace;
	// empty is the context's cwd.
	Cwd string
	// Env is laid over the context's environment.
	Env     map[string]string
	Timeout time.Duration // 0: no limit
	// Stdin keeps the command's standard input open for Run.Input;
	// without it the command reads an empty input.
	Stdin bool
	// Forwarded: another replica accepted and recorded the run (its id
	// is kept; a run of that id known here already is returned as it is).
	Forwarded Forwarded
}

// ShellCommand is the argv that runs s with /bin/sh -c.
func ShellCommand(s string) []string { return []string{"/bin/sh", "-c", s} }

// commandStarter is the part of a kernel process that starts commands
// (a *jupyter.Kernel), whichever provisioner runs the kernel.
type commandStarter interface {
	StartCommand(ctx context.Context, req jupyter.CommandRequest) (jupyter.Command, error)
}

var _ commandStarter = jupyterProcess{}

// commandRun is what a context keeps of a command that runs.
type commandRun struct {
	cmd jupyter.Command
	// why is how the run is to end when the process does (interrupted,
	// killed, timed out), guarded by mu.
	mu  sync.Mutex
	why runs.Reason
}

// RunCommand starts a command beside the context's kernel (starting the
// kernel if it has none) and returns its run, already running.
func (m *Manager) RunCommand(ctx context.Context, req CommandRequest) (*runs.Run, error) {
	if r, ok := m.knownRun(req.Forwarded); ok {
		return r, nil
	}
	if err := checkArgv(req.Argv); err != nil {
		return nil, err
	}
	if err := checkEnv(req.Env); err != nil {
		return nil, err
	}
	if req.Timeout < 0 {
		return nil, errorf(ErrBadRequest, "timeout must be 0 (none) or a number of seconds")
	}
	c, err := m.commandContext(req)
	if err != nil {
		return nil, err
	}
	dir, err := commandDir(c, req.Cwd)
	if err != nil {
		return nil, err
	}
	k, jk, err := c.ensureKernel(ctx)
	if err != nil {
		return nil, err
	}
	if err := m.acting(k.id); err != nil {
		return nil, err
	}
	starter, ok := jk.(commandStarter)
	if !ok {
		return nil, errorf(ErrUnsupported, "context %s's kernel cannot run commands beside it: restart the context", c.ID)
	}
	// The environment the kernel's setup code made: the context's env,
	// then, in a Python kernel, pip's variables for the workspace's
	// packages, whose scripts come first on PATH.
	env := make(map[string]string, len(c.Env)+len(req.Env)+8)
	for k, v := range c.Env {
		env[k] = v
	}
	var pathFirst []string
	if c.ws != nil && strings.EqualFold(c.spec.Language, "python") {
		pip := m.catalog.pipEnv(c.ws)
		for k, v := range pip {
			env[k] = v
		}
		pathFirst = []string{filepath.Join(pip["PYTHONUSERBASE"], "bin")}
	}
	for k, v := range req.Env {
		env[k] = v
	}
	r, existed, err := c.forwardedRun(ExecuteRequest{Code: commandText(req.Argv), Stdin: req.Stdin, Timeout: req.Timeout}, req.Forwarded)
	if err != nil || existed {
		return r, err
	}
	cmd, err := starter.StartCommand(ctx, jupyter.CommandRequest{Argv: req.Argv, Dir: dir, Env: env, PathFirst: pathFirst, Stdin: req.Stdin})
	if err != nil {
		m.runs.Drop(r, err)
		switch {
		case errors.Is(err, jupyter.ErrNoProgram):
			return nil, errorf(ErrBadRequest, "%v", err)
		case errors.Is(err, syscall.E2BIG):
			return nil, errorf(ErrBadRequest, "the command's arguments and environment are too long for a process: %v", err)
		case errors.Is(err, jupyter.ErrNoCommands):
			return nil, errorf(ErrUnsupported, "context %s's kernel cannot run commands beside it: restart the context", c.ID)
		}
		return nil, errorf(ErrKernelStart, "the command did not start: %v", err)
	}
	cr := &commandRun{cmd: cmd}
	if !c.addCommand(r, cr) {
		cmd.Kill()
		<-cmd.Done()
		cmd.Stdout().Close()
		cmd.Stderr().Close()
		m.runs.Drop(r, errorf(ErrNoSuchContext, "context %s was deleted", c.ID))
		return nil, errorf(ErrNoSuchContext, "context %s was deleted", c.ID)
	}
	k.touch(+1)
	controls := runs.Controls{ExitCode: true, Cancel: func(why runs.Reason) { c.stopCommand(r, cr, why) }}
	if in := cmd.Stdin(); in != nil {
		controls.Input = func(value string) error { return writeStdin(in, value) }
		controls.CloseInput = func() { in.Close() }
		controls.AnyInput = true
	}
	r.SetControls(controls)
	r.Start()
	r.ArmDeadline(func() { c.stopCommand(r, cr, runs.TimedOut) })
	// Its id leaves the gateway now: its record is committed first, as
	// a code run's is (runs.Journal).
	r.Promise()
	m.goroutine(func() { c.superviseCommand(k, r, cr) })
	return r, nil
}

// checkArgv refuses an empty command and what no process can be given.
func checkArgv(argv []string) error {
	switch {
	case len(argv) == 0 || argv[0] == "":
		return errorf(ErrBadRequest, "cmd is required: a string for /bin/sh -c or a list of arguments")
	case len(argv) > MaxCommandArgs:
		return errorf(ErrBadRequest, "cmd has %d arguments; at most %d", len(argv), MaxCommandArgs)
	}
	for _, a := range argv {
		if strings.ContainsRune(a, 0) {
			return errorf(ErrBadRequest, "cmd contains a NUL character (U+0000), which no process argument can hold: remove it")
		}
	}
	return nil
}

// commandText is how a command's argv is shown and kept as the run's code.
func commandText(argv []string) string {
	if len(argv) == 3 && argv[0] == "/bin/sh" && argv[1] == "-c" {
		return argv[2]
	}
	return strings.Join(argv, " ")
}

// commandContext returns the context a command runs in: a context, or
// the shared kernel of a language (code-python, …), made if it has not
// run code yet.
func (m *Manager) commandContext(req CommandRequest) (*Context, error) {
	if req.Context == "" {
		return m.sharedContext(ExecuteRequest{Language: req.Language, Kernelspec: req.Kernelspec})
	}
	id := req.Context
	c, err := m.Context(id)
	if err == nil || !errors.Is(err, ErrNoSuchContext) {
		return c, err
	}
	for _, lang := range m.catalog.Languages() {
		if id == sharedID(lang) {
			return m.sharedContext(ExecuteRequest{Language: lang})
		}
	}
	return nil, err
}

// commandDir is the host path of a command's cwd: relative to the
// context's workspace (or absolute inside it), an existing folder.
func commandDir(c *Context, cwd string) (string, error) {
	if cwd == "" || c.ws == nil {
		return c.Cwd, nil
	}
	rel, err := wsRel(c.ws, cwd)
	if err != nil {
		return "", err
	}
	e, err := c.ws.Stat(rel)
	if err != nil {
		return "", errorf(ErrBadRequest, "cwd %s: %v", cwd, err)
	}
	if e.Type != "dir" {
		return "", errorf(ErrBadRequest, "cwd %s is not a folder", cwd)
	}
	return c.ws.Resolve(rel)
}

// addCommand records a running command of c and its run among c's runs;
// false when c was deleted meanwhile.
func (c *Context) addCommand(r *runs.Run, cr *commandRun) bool {
	c.mu.Lock()
	if c.deleted {
		c.mu.Unlock()
		return false
	}
	if c.commands == nil {
		c.commands = map[*runs.Run]*commandRun{}
	}
	c.commands[r] = cr
	c.mu.Unlock()
	c.runs.NoteRun(r.ID)
	return true
}

// stopCommand ends a running command: SIGINT to interrupt it, SIGKILL to
// kill it or when its timeout ran out. The first reason given is how the
// run ends, unless the command exits on its own first.
func (c *Context) stopCommand(r *runs.Run, cr *commandRun, why runs.Reason) {
	if r.State() == runs.RunDone {
		return
	}
	cr.mu.Lock()
	if cr.why == "" || cr.why == runs.Interrupted {
		cr.why = why
	}
	cr.mu.Unlock()
	if why == runs.Interrupted {
		cr.cmd.Interrupt()
	} else {
		cr.cmd.Kill()
	}
}

// stopCommands kills the commands of a deleted context (c.deleted is set).
func (c *Context) stopCommands(why string) {
	c.mu.Lock()
	running := make([]*commandRun, 0, len(c.commands))
	rs := make([]*runs.Run, 0, len(c.commands))
	for r, cr := range c.commands {
		running = append(running, cr)
		rs = append(rs, r)
	}
	c.mu.Unlock()
	for i, cr := range running {
		cr.mu.Lock()
		if cr.why == "" {
			cr.why = runs.Lost
			rs[i].SetNotice(why)
		}
		cr.mu.Unlock()
		cr.cmd.Kill()
	}
}

// superviseCommand folds the command's output into its run and ends the
// run once the process ended and its output was read.
func (c *Context) superviseCommand(k *Kernel, r *runs.Run, cr *commandRun) {
	outDone := make(chan struct{})
	go func() { // owned here: ends at EOF, at the latest commandDrain after the process
		defer close(outDone)
		c.readCommandOutput(k, r, "stderr", cr.cmd.Stderr())
	}()
	c.readCommandOutput(k, r, "stdout", cr.cmd.Stdout())
	<-outDone
	code := cr.cmd.ExitCode()
	cr.cmd.Stdout().Close()
	cr.cmd.Stderr().Close()
	c.mu.Lock()
	delete(c.commands, r)
	c.mu.Unlock()
	k.touch(-1)
	cr.mu.Lock()
	why := cr.why
	cr.mu.Unlock()
	// A command killed with no one asking went with its kernel, whose
	// end (a restart, a death) kills what runs in the kernel's cgroup.
	killedWithKernel := why == "" && cr.cmd.KilledWithKernel(time.Second)
	cr.mu.Lock()
	reason := cr.why
	cr.mu.Unlock()
	switch {
	case reason == "" && killedWithKernel:
		reason = runs.Lost
		r.SetNotice("the context's kernel was restarted or ended during the command, and the processes beside it with it")
	case reason == "":
		reason = runs.Completed
	}
	r.SetExitCode(code)
	r.Finish(reason, nil)
}

// readCommandOutput streams one of the command's outputs into its run
// until EOF; a character split between two reads is kept whole.
func (c *Context) readCommandOutput(k *Kernel, r *runs.Run, name string, f io.Reader) {
	buf := make([]byte, commandReadSize)
	var carry int
	for {
		n, err := f.Read(buf[carry:])
		n += carry
		carry = 0
		if n > 0 {
			text := buf[:n]
			if err == nil {
				// Keep an incomplete UTF-8 sequence at the end for the next read.
				if k := incompleteTail(text); k > 0 {
					carry = k
					text = text[:n-k]
				}
			}
			r.Output(name, string(text))
			if carry > 0 {
				copy(buf, buf[n-carry:n])
			}
			k.touch(0)
		}
		if err != nil {
			return // EOF, or the pipe's deadline after the process ended
		}
	}
}

// incompleteTail is how many bytes at the end of b begin a UTF-8
// sequence that is not complete yet (0 to 3).
func incompleteTail(b []byte) int {
	for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
		c := b[len(b)-i]
		if !utf8.RuneStart(c) {
			continue
		}
		if !utf8.FullRune(b[len(b)-i:]) {
			return i
		}
		return 0
	}
	return 0
}

// writeStdin writes value to a command's input, waiting at most
// stdinWriteWait for a command that does not read it.
func writeStdin(f jupyter.CommandInput, value string) error {
	f.SetWriteDeadline(time.Now().Add(stdinWriteWait))
	_, err := io.WriteString(f, value)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return errorf(ErrTimeout, "the command did not read its input within %v: the value was not (or not wholly) written", stdinWriteWait)
	}
	return errorf(ErrBadRequest, "the command's input is closed: it has ended")
}

// touch records activity on the kernel, for the culler, and counts the
// commands running beside it up or down by n.
func (k *Kernel) touch(n int) {
	k.mu.Lock()
	k.lastAct = time.Now()
	k.commands += n
	k.mu.Unlock()
}

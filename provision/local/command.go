package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"kernelgate/internal/sysproc"

	"kernelgate/jupyter"
)

// A command is a process started beside a kernel: with the kernel's
// environment, as its user, in its cgroup (so under its memory and process
// limits) with its rlimits, and, for a sandboxed kernel, in a bubblewrap
// sandbox built as the kernel's is (the same folders bound, the same
// paths hidden, no network unless the kernel has it). It runs in a
// process group of its own, which Kill ends.

// commandDrain is how long a command's output pipes stay open once its
// process has ended: a child that left its process group may hold them.
const commandDrain = time.Second

// Command is a process running beside a local kernel.
type Command struct {
	// stdout and stderr are the read ends of the command's output, stdin
	// the write end of its input (nil unless asked for).
	stdout, stderr, stdin *os.File

	cmd    *exec.Cmd
	done   chan struct{}
	code   int             // set before done is closed
	kernel <-chan struct{} // closed when the kernel's process has ended
}

var _ jupyter.Command = (*Command)(nil)

// commandPlan is what a launch keeps to start commands beside its kernel.
type commandPlan struct {
	env     map[string]string // the kernel's environment as launched
	kept    map[string]string // env without the launch request's Env (info)
	cwd     string            // the kernel's working directory
	iso     isolation
	runtime string
	kd      KernelDirs
	cg      *kernelCgroup
	done    <-chan struct{} // the kernel's process ended
}

// of is the plan for the kernel process whose end closes done.
func (p commandPlan) of(done <-chan struct{}) *commandPlan {
	p.done = done
	return &p
}

// Stdout is the read end of the command's standard output: read it until
// EOF (which comes at the latest commandDrain after the process ended),
// then close it.
func (c *Command) Stdout() io.ReadCloser { return c.stdout }

// Stderr is the read end of its standard error, as Stdout.
func (c *Command) Stderr() io.ReadCloser { return c.stderr }

// Stdin is the write end of its input, nil unless asked for; its writes
// take deadlines.
func (c *Command) Stdin() jupyter.CommandInput {
	if c.stdin == nil {
		return nil
	}
	return c.stdin
}

// Interrupt sends SIGINT to the command's process group.
func (c *Command) Interrupt() error { return c.Signal(syscall.SIGINT) }

// Kill sends SIGKILL to the command's process group.
func (c *Command) Kill() error { return c.Signal(syscall.SIGKILL) }

// PID is the command's process (its group's leader).
func (c *Command) PID() int { return c.cmd.Process.Pid }

// Done is closed once the command's process has ended and been reaped.
func (c *Command) Done() <-chan struct{} { return c.done }

// ExitCode is the command's exit status once Done is closed: 128 plus
// the signal's number when a signal ended it.
func (c *Command) ExitCode() int {
	<-c.done
	return c.code
}

// KilledWithKernel says, once Done is closed, whether SIGKILL ended the
// command because its kernel's process ended (which kills the kernel's
// cgroup); it waits up to wait for the kernel's end to be known.
func (c *Command) KilledWithKernel(wait time.Duration) bool {
	if c.ExitCode() != 128+int(syscall.SIGKILL) {
		return false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-c.kernel:
		return true
	case <-t.C:
		return false
	}
}

// Signal sends sig to the command's process group.
func (c *Command) Signal(sig syscall.Signal) error {
	select {
	case <-c.done:
		return os.ErrProcessDone
	default:
	}
	return sysproc.Kill(-c.cmd.Process.Pid, sig)
}

// StartCommand implements jupyter.CommandStarter.
func (lp *localProcess) StartCommand(ctx context.Context, req jupyter.CommandRequest) (jupyter.Command, error) {
	return lp.plan.start(ctx, req)
}

var _ jupyter.CommandStarter = (*localProcess)(nil)

// start launches req as the kernel was launched: behind the gate, joined
// to the kernel's cgroup with its rlimits before its first instruction.
func (p *commandPlan) start(ctx context.Context, req jupyter.CommandRequest) (jupyter.Command, error) {
	if p == nil {
		return nil, jupyter.ErrNoCommands
	}
	select {
	case <-p.done:
		return nil, fmt.Errorf("%w: the kernel's process has ended", jupyter.ErrKernelDied)
	default:
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, errors.New("jupyter: a command needs a program")
	}
	env := make(map[string]string, len(p.env)+len(req.Env))
	for k, v := range p.env {
		env[k] = v
	}
	for k, v := range req.Env {
		env[k] = v
	}
	if len(req.PathFirst) > 0 {
		env["PATH"] = strings.Join(append(append([]string{}, req.PathFirst...), env["PATH"]), string(os.PathListSeparator))
	}
	dir := req.Dir
	if dir == "" {
		dir = p.cwd
	}
	if p.iso.sandbox != nil && !within(dir, p.cwd) && !within(dir, p.kd.Root) {
		return nil, fmt.Errorf("jupyter: a sandboxed command works inside its kernel's folders, not in %s", dir)
	}
	argv := append([]string{}, req.Argv...)
	if strings.Contains(argv[0], "/") && !filepath.IsAbs(argv[0]) {
		argv[0] = filepath.Join(dir, argv[0]) // as a shell finds ./script
	}
	argv, err := p.command(argv, env["PATH"], dir)
	if err != nil {
		return nil, err
	}
	cmd, gate, err := gatedCommand(argv)
	if err != nil {
		return nil, err
	}
	c := &Command{cmd: cmd, done: make(chan struct{}), kernel: p.done}
	// parent are the gateway's ends, child the command's: the latter are
	// closed once it started, the former too if it did not.
	var parent, child []*os.File
	closeAll := func(files []*os.File) {
		for _, f := range files {
			f.Close()
		}
	}
	fail := func(err error) (jupyter.Command, error) {
		gate.Close()
		closeChildEnds(cmd)
		closeAll(child)
		closeAll(parent)
		return nil, err
	}
	pipe := func(toChild bool) (*os.File, error) {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		if toChild {
			parent, child = append(parent, w), append(child, r)
			return w, nil
		}
		parent, child = append(parent, r), append(child, w)
		return r, nil
	}
	if c.stdout, err = pipe(false); err != nil {
		return fail(err)
	}
	if c.stderr, err = pipe(false); err != nil {
		return fail(err)
	}
	cmd.Stdout, cmd.Stderr = child[0], child[1]
	if req.Stdin {
		if c.stdin, err = pipe(true); err != nil {
			return fail(err)
		}
		cmd.Stdin = child[2]
	}
	cmd.Env = envList(env)
	cmd.Dir = dir
	cmd.SysProcAttr = sysproc.GroupAttr()
	if p.iso.sandbox != nil {
		p.iso.user.setCredential(cmd.SysProcAttr)
	}
	// Its Pdeathsig follows the starting thread (zygote.go): a command
	// ends with the gateway process.
	if err := startOnParentThread(cmd); err != nil {
		return fail(err)
	}
	closeAll(child)
	closeChildEnds(cmd) // the gate's read end
	pid := cmd.Process.Pid
	err = func() error {
		if p.cg != nil {
			// A kernel that ended meanwhile took its cgroup along: the
			// command never runs outside it.
			if len(p.cg.snapshot()) == 0 {
				return fmt.Errorf("%w: the kernel's cgroup is gone", jupyter.ErrKernelDied)
			}
			if err := p.cg.join(pid); err != nil {
				return fmt.Errorf("cgroup: %w", err)
			}
		}
		if err := p.iso.user.peerOf(func() error { return p.iso.limits.setRlimits(pid) }); err != nil {
			return err
		}
		return openGate(gate)
	}()
	if err != nil {
		gate.Close()
		sysproc.Kill(-pid, syscall.SIGKILL)
		cmd.Wait()
		closeAll(parent)
		return nil, err
	}
	go c.wait()
	return c, nil
}

// command resolves argv[0] with PATH and, for a sandboxed kernel, puts
// bwrap in front with the options of the kernel's sandbox, starting in
// dir. The files it binds over hidden paths exist since the kernel's
// launch.
func (p *commandPlan) command(argv []string, path, dir string) ([]string, error) {
	exe, err := lookPath(argv[0], path)
	if err != nil {
		return nil, fmt.Errorf("%w: %s is not an executable on the kernel's PATH (%v)", jupyter.ErrNoProgram, argv[0], err)
	}
	argv = append([]string{exe}, argv[1:]...)
	if p.iso.sandbox == nil {
		return argv, nil
	}
	bwrap, err := p.iso.sandbox.bwrapPath()
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	args, err := p.iso.sandbox.bwrapArgs(p.iso.user, p.runtime, p.kd, p.cwd, dir, exe, 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	return append(append([]string{bwrap}, args...), argv...), nil
}

// wait is the one goroutine that owns cmd.Wait. What the command left in
// its group goes with it; output pipes held open by a child that left the
// group end commandDrain later.
func (c *Command) wait() {
	err := c.cmd.Wait()
	c.code = exitCode(c.cmd.ProcessState, err)
	sysproc.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	deadline := time.Now().Add(commandDrain)
	c.stdout.SetReadDeadline(deadline)
	c.stderr.SetReadDeadline(deadline)
	if c.stdin != nil {
		c.stdin.Close()
	}
	close(c.done)
}

// exitCode is a shell's view of how a process ended.
func exitCode(ps *os.ProcessState, err error) int {
	if ps == nil {
		if err != nil {
			return 127
		}
		return 0
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

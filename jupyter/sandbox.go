package jupyter

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// SandboxConfig runs kernels inside bubblewrap: the host's file system
// read-only, private /tmp, /dev and /proc, new PID, IPC, UTS and cgroup
// namespaces, no capabilities, its own session, and, unless Network is
// set, a network namespace of its own with only loopback. The kernel can
// write only its own directories (HOME, TMPDIR, the working directory and
// the connection file's directory) and, when the launch names one, its
// working directory. The provisioner's runtime directory is hidden, so a
// kernel sees no other kernel's files. Limits still apply: bwrap is the
// process put into the kernel's cgroup, and everything it starts inherits
// the cgroup and the rlimits.
//
// SIGINT to bwrap would kill the whole sandbox, so a sandboxed kernel is
// always interrupted with an interrupt_request on control.
type SandboxConfig struct {
	// Bwrap is the bubblewrap binary; empty means bwrap on the gateway's
	// PATH, then /usr/bin/bwrap.
	Bwrap string
	// Network shares the host's network with the kernel. Without it a
	// kernel on the ipc transport (LocalProvisioner.Transport "ipc") is
	// reached through its sockets, and any other through a bridge from
	// unix sockets of the gateway to the kernel's TCP ports inside its
	// network namespace, which needs CAP_SYS_ADMIN (root).
	Network bool
	// Hide lists host paths the kernel sees empty, such as the gateway's
	// configuration, credentials and HOME: a directory as an empty tmpfs,
	// a file as an empty file. Paths that do not exist are skipped. /tmp,
	// /var/tmp and the provisioner's runtime directory are always hidden.
	Hide []string
}

// messageInterrupter is implemented by a Process that must be interrupted
// with an interrupt_request whatever its kernelspec says, because a signal
// would reach a wrapper (bwrap) rather than the kernel.
type messageInterrupter interface {
	InterruptByMessage() bool
}

// interruptsByMessage says whether p asks for message interrupts.
func interruptsByMessage(p Process) bool {
	m, ok := p.(messageInterrupter)
	return ok && m.InterruptByMessage()
}

// bwrapPath resolves the bubblewrap binary.
func (c *SandboxConfig) bwrapPath() (string, error) {
	if c.Bwrap != "" {
		return c.Bwrap, isExecutable(c.Bwrap)
	}
	if p, err := exec.LookPath("bwrap"); err == nil {
		return filepath.Abs(p)
	}
	const fallback = "/usr/bin/bwrap"
	if err := isExecutable(fallback); err != nil {
		return "", fmt.Errorf("bubblewrap not found: %w", err)
	}
	return fallback, nil
}

// sandboxInfoFD is the descriptor on which bwrap reports the pid of the
// sandbox (ExtraFiles[1] of the gated command).
const sandboxInfoFD = 4

// bwrapArgs returns the bwrap options (ending in "--") that sandbox a
// kernel with directories kd, working directory cwd, under runtime root
// runtime. With infoFD > 0 bwrap writes {"child-pid": N} to it.
func (c *SandboxConfig) bwrapArgs(runtime string, kd KernelDirs, cwd, startDir string, infoFD int) []string {
	a := []string{
		"--ro-bind", "/", "/",
		"--dev", "/dev",
		"--proc", "/proc",
		"--tmpfs", "/tmp",
	}
	hidden := append([]string{"/var/tmp"}, c.Hide...)
	for _, h := range append(hidden, runtime) {
		h = filepath.Clean(h)
		if !filepath.IsAbs(h) || h == "/" || within(h, "/tmp") {
			continue // /tmp is an empty tmpfs already
		}
		fi, err := os.Stat(h)
		switch {
		case err != nil:
		case fi.IsDir():
			a = append(a, "--tmpfs", h)
		default:
			a = append(a, "--ro-bind", emptyFile(kd), h)
		}
	}
	a = append(a, "--bind", kd.Root, kd.Root)
	if !within(cwd, kd.Root) {
		a = append(a, "--bind", cwd, cwd)
	}
	a = append(a, "--chdir", startDir,
		"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		"--die-with-parent", "--new-session", "--cap-drop", "ALL")
	if !c.Network {
		a = append(a, "--unshare-net")
	}
	if infoFD > 0 {
		a = append(a, "--info-fd", strconv.Itoa(infoFD))
	}
	return append(a, "--")
}

// emptyFile is an empty file in the gateway's part of a kernel's
// directory, bound over hidden files (a bind of /dev/null could not be
// read: binds are nodev).
func emptyFile(kd KernelDirs) string { return filepath.Join(filepath.Dir(kd.Root), "empty") }

// within says whether path is dir or below it.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// readSandboxPid reads the pid of the sandbox's first process (outside
// view) from bwrap's info descriptor.
func readSandboxPid(r *os.File, wait time.Duration) (int, error) {
	r.SetReadDeadline(time.Now().Add(wait))
	var info struct {
		ChildPid int `json:"child-pid"`
	}
	if err := json.NewDecoder(r).Decode(&info); err != nil {
		return 0, fmt.Errorf("bwrap did not report its sandbox: %w", err)
	}
	if info.ChildPid <= 0 {
		return 0, fmt.Errorf("bwrap reported no sandbox pid")
	}
	return info.ChildPid, nil
}

// parentOf reads the parent pid of pid from /proc.
func parentOf(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 2 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return strconv.Atoi(fields[1])
}

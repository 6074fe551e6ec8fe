package local

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/procfs"
)

// SandboxConfig runs kernels inside bubblewrap: the host's file system
// read-only, private /tmp, /dev and /proc, new PID, IPC, UTS and cgroup
// namespaces, no capabilities, its own session, and, unless Network is
// set, a network namespace of its own with only loopback. The kernel can
// write only its own directories (HOME, TMPDIR, the working directory and
// the connection file's directory) and, when the launch names one, its
// working directory. The provisioner's runtime directory is hidden, so a
// kernel sees no other kernel's files, and so are the host's password
// hashes, sudo's and SSH's configuration and root's SSH keys (alwaysHidden).
// Limits still apply: bwrap is the process put into the kernel's cgroup,
// and everything it starts inherits the cgroup and the rlimits.
//
// A gateway running as root runs sandboxed kernels as an unprivileged host
// user (UID, GID; nobody by default), so that a kernel reads only what
// any user may read, never what root's owner bits allow: bwrap starts as
// that user without supplementary groups and, being neither root nor
// setuid, puts the sandbox in a user namespace of its own. The kernel's
// directories are handed to that user; the provisioner's runtime directory
// and the per-kernel directory above them become searchable but not
// listable (0711), while what the gateway keeps there stays its own. The
// directories above the runtime directory, and the working directory a
// launch names, must be searchable by the sandbox user or the launch
// fails. A working directory the user cannot write is bound all the same
// and the kernel cannot write there: the operator gives the sandbox user
// the workspace (e.g. a --workspace-root it owns). A gateway that is not
// root runs kernels as its own user.
//
// SIGINT to bwrap would kill the whole sandbox, so a sandboxed kernel is
// always interrupted with an interrupt_request on control.
type SandboxConfig struct {
	// Bwrap is the bubblewrap binary; empty means bwrap on the gateway's
	// PATH, then /usr/bin/bwrap.
	Bwrap string
	// Network shares the host's network with the kernel. Without it a
	// kernel on the ipc transport (Provisioner.Transport "ipc") is
	// reached through its sockets, and any other through a bridge from
	// unix sockets of the gateway to the kernel's TCP ports inside its
	// network namespace, which needs CAP_SYS_ADMIN (root).
	Network bool
	// Hide lists host paths the kernel sees empty, such as the gateway's
	// configuration, credentials and HOME: a directory as an empty tmpfs,
	// a file as an empty file. Paths that do not exist, or that the
	// sandbox user cannot reach (and so cannot read either), are skipped.
	// /tmp, /var/tmp, the provisioner's runtime directory and alwaysHidden
	// are always hidden.
	Hide []string
	// UID and GID are the host user and group a gateway running as root
	// runs sandboxed kernels as; 0 means 65534 (nobody, nogroup), so that
	// such a kernel never runs as root nor in root's group. A gateway that
	// is not root runs kernels as its own user and refuses any other.
	UID, GID int
}

// alwaysHidden are host paths every sandbox hides, whatever its user may
// read: password hashes, sudo's and SSH's configuration, root's SSH keys.
// A file among them is replaced by an empty file that no one may read, so
// reading it fails as it would for any unprivileged user.
var alwaysHidden = []string{
	"/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-",
	"/etc/sudoers", "/etc/sudoers.d", "/etc/ssh", "/root/.ssh",
}

// messageInterrupter is implemented by a Process that must be interrupted
// with an interrupt_request whatever its kernelspec says, because a signal
// would reach a wrapper (bwrap) rather than the kernel.
type messageInterrupter interface {
	InterruptByMessage() bool
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
// runtime, as user u. With infoFD > 0 bwrap writes {"child-pid": N} to
// it. Paths are looked up as u, as bwrap will look them up: hidden paths
// u cannot reach are skipped, and kd.Root, cwd and startDir must be
// reachable.
func (c *SandboxConfig) bwrapArgs(u sandboxUser, runtime string, kd KernelDirs, cwd, startDir, program string, infoFD int) ([]string, error) {
	type hiddenPath struct {
		path   string
		sealed bool // a file is replaced by sealedFile, not emptyFile
		info   os.FileInfo
	}
	var hidden []hiddenPath
	add := func(paths []string, sealed bool) {
		for _, h := range paths {
			h = filepath.Clean(h)
			if filepath.IsAbs(h) && h != "/" && !within(h, "/tmp") { // /tmp is an empty tmpfs already
				hidden = append(hidden, hiddenPath{path: h, sealed: sealed})
			}
		}
	}
	add([]string{"/var/tmp"}, false)
	add(alwaysHidden, true)
	add(c.Hide, false)
	add([]string{runtime}, false)
	enter := []string{kd.Root, startDir}
	if !within(cwd, kd.Root) {
		enter = append(enter, cwd)
	}
	err := u.lookAs(func() error {
		for i := range hidden {
			hidden[i].info, _ = os.Stat(hidden[i].path)
		}
		for _, d := range enter {
			if err := canEnter(d); err != nil {
				return fmt.Errorf("sandbox user %s cannot enter %s (%w): it and the directories above it must be searchable by that user", u, d, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	a := []string{
		"--ro-bind", "/", "/",
		"--dev", "/dev",
		"--proc", "/proc",
		"--tmpfs", "/tmp",
	}
	for _, h := range hidden {
		switch {
		case h.info == nil:
		case h.info.IsDir():
			a = append(a, "--tmpfs", h.path)
		case h.sealed:
			a = append(a, "--ro-bind", sealedFile(kd), h.path)
		default:
			a = append(a, "--ro-bind", emptyFile(kd), h.path)
		}
	}
	// A kernel installed below /tmp (a checkout there, say) would vanish
	// under the empty /tmp: its program's directory comes back read-only.
	if program != "" {
		if real, err := filepath.EvalSymlinks(program); err == nil {
			dir := filepath.Dir(real)
			if within(dir, "/tmp") || within(dir, "/var/tmp") || within(dir, runtime) {
				a = append(a, "--ro-bind", dir, dir)
			}
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
	return append(a, "--"), nil
}

// emptyFile and sealedFile are empty files in the gateway's part of a
// kernel's directory, bound over hidden files (a bind of /dev/null could
// not be read: binds are nodev). Anyone may read emptyFile; no one but
// root with its capabilities may read sealedFile.
func emptyFile(kd KernelDirs) string  { return filepath.Join(filepath.Dir(kd.Root), "empty") }
func sealedFile(kd KernelDirs) string { return filepath.Join(filepath.Dir(kd.Root), "sealed") }

// writeHideFiles creates emptyFile and sealedFile.
func writeHideFiles(kd KernelDirs) error {
	if err := os.WriteFile(emptyFile(kd), nil, 0o444); err != nil {
		return err
	}
	if err := os.WriteFile(sealedFile(kd), nil, 0); err != nil {
		return err
	}
	return os.Chmod(emptyFile(kd), 0o444) // whatever the umask
}

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
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, err
	}
	st, err := p.Stat()
	return st.PPID, err
}

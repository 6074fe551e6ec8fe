package local

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"kernelgate/jupyter"
)

// DefaultKernelPath is a kernel's PATH unless the provisioner's BaseEnv
// names another.
const DefaultKernelPath = "/usr/local/bin:/usr/bin:/bin"

// Bounds of the environment a launch request may add.
const (
	MaxEnvVars  = 64
	MaxEnvValue = 4096
	maxEnvName  = 128
)

// KernelDirs are the directories of one kernel, made by the gateway. A
// launch makes them fresh and Cleanup removes them, so a kernel never
// reads configuration or startup files that an earlier kernel wrote into
// its HOME, its IPython directory or its working directory. They belong to
// the gateway's user or, for a kernel a root gateway sandboxes, to the
// sandbox user (SandboxConfig.UID).
type KernelDirs struct {
	// Root holds the connection file and, for the ipc transport, the
	// sockets; it is the one directory a sandboxed kernel may write.
	Root string
	// Home is HOME; IPython, Jupyter, matplotlib and Deno keep their
	// state below it.
	Home string
	// Work is the working directory when the launch names none.
	Work string
	// Tmp is TMPDIR.
	Tmp string
}

// newKernelDirs creates root and the directories below it, private to
// their owner.
func newKernelDirs(root string) (KernelDirs, error) {
	d := KernelDirs{
		Root: root,
		Home: filepath.Join(root, "home"),
		Work: filepath.Join(root, "work"),
		Tmp:  filepath.Join(root, "tmp"),
	}
	for _, dir := range []string{d.Root, d.Home, d.Work, d.Tmp} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			return KernelDirs{}, err
		}
	}
	return d, nil
}

// CleanEnv returns the environment a kernel starts from. It is built from
// scratch, never from the gateway's own environment: a fixed PATH, a UTF-8
// locale, and HOME, TMPDIR and every directory in which IPython, Jupyter,
// matplotlib and Deno look for configuration or keep caches pointing into
// d. TERM is "dumb" because output goes to a client, not a terminal;
// PYTHONUNBUFFERED makes the kernel's own stdout reach the output tail (and
// so a DiedError) before the process dies.
func CleanEnv(d KernelDirs) map[string]string {
	home := d.Home
	return map[string]string{
		"PATH":                DefaultKernelPath,
		"LANG":                "C.UTF-8",
		"LC_ALL":              "C.UTF-8",
		"HOME":                home,
		"TMPDIR":              d.Tmp,
		"TERM":                "dumb",
		"PYTHONUNBUFFERED":    "1",
		"IPYTHONDIR":          filepath.Join(home, ".ipython"),
		"JUPYTER_CONFIG_DIR":  filepath.Join(home, ".jupyter"),
		"JUPYTER_DATA_DIR":    filepath.Join(home, ".local", "share", "jupyter"),
		"JUPYTER_RUNTIME_DIR": filepath.Join(home, ".local", "share", "jupyter", "runtime"),
		"MPLCONFIGDIR":        filepath.Join(home, ".config", "matplotlib"),
		"DENO_DIR":            filepath.Join(home, ".cache", "deno"),
		"XDG_CONFIG_HOME":     filepath.Join(home, ".config"),
		"XDG_CACHE_HOME":      filepath.Join(home, ".cache"),
		"XDG_DATA_HOME":       filepath.Join(home, ".local", "share"),
		"XDG_STATE_HOME":      filepath.Join(home, ".local", "state"),
	}
}

// EnvError says which variable of a launch request was refused and why.
// It matches ErrEnvNotAllowed; it never repeats the value.
type EnvError struct {
	Name   string // truncated when long
	Reason string
}

func (e *EnvError) Error() string {
	if e.Name == "" {
		return "jupyter: environment not allowed: " + e.Reason
	}
	return fmt.Sprintf("jupyter: environment variable %q not allowed: %s", e.Name, e.Reason)
}

func (e *EnvError) Unwrap() error { return jupyter.ErrEnvNotAllowed }

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Names a client may never set, compared in upper case: they point a
// kernel at other code, other configuration or other directories than the
// gateway chose (loader, interpreters, Jupyter/IPython, Deno, Node, shells,
// glibc's list of variables unsafe for setuid programs), route its
// traffic (*_PROXY), or belong to the gateway.
var (
	deniedEnv = map[string]bool{
		"HOME": true, "PATH": true, "TMPDIR": true, "SHELL": true, "ENV": true, "IFS": true,
		"CDPATH": true, "SHELLOPTS": true, "BASHOPTS": true, "PROMPT_COMMAND": true,
		"IPYTHONDIR": true, "MPLCONFIGDIR": true, "VIRTUAL_ENV": true,
		"NODE_OPTIONS": true, "NODE_PATH": true,
		"CLASSPATH": true, "JAVA_TOOL_OPTIONS": true, "_JAVA_OPTIONS": true, "JDK_JAVA_OPTIONS": true,
		"GCONV_PATH": true, "GETCONF_DIR": true, "GLIBC_TUNABLES": true, "HOSTALIASES": true,
		"LOCALDOMAIN": true, "LOCPATH": true, "NIS_PATH": true, "NLSPATH": true,
		"RESOLV_HOST_CONF": true, "RES_OPTIONS": true, "TZDIR": true, "SSH_AUTH_SOCK": true,
	}
	deniedEnvPrefixes = []string{
		"LD_", "PYTHON", "IPYTHON", "JUPYTER_", "JPY_", "MPL", "DENO_", "NODE_", "BASH_",
		"XDG_", "MALLOC_", "CONDA_", "PERL5", "RUBY", "JULIA_", "R_",
		"KERNELGATE_", "KUBERNETES_",
	}
)

// ValidateEnv checks variables a client wants in a kernel's environment:
// at most MaxEnvVars of them, names matching [A-Za-z_][A-Za-z0-9_]* and not
// on the deny list (any case), values of at most MaxEnvValue bytes without
// NUL, CR or LF. The error is an *EnvError for the first refused name in
// sorted order.
func ValidateEnv(env map[string]string) error {
	if len(env) > MaxEnvVars {
		return &EnvError{Reason: fmt.Sprintf("more than %d variables", MaxEnvVars)}
	}
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if reason := envNameProblem(k); reason != "" {
			return &EnvError{Name: truncate(k, maxEnvName), Reason: reason}
		}
		v := env[k]
		switch {
		case len(v) > MaxEnvValue:
			return &EnvError{Name: k, Reason: fmt.Sprintf("value longer than %d bytes", MaxEnvValue)}
		case strings.ContainsAny(v, "\x00\r\n"):
			return &EnvError{Name: k, Reason: "value holds NUL, CR or LF"}
		}
	}
	return nil
}

func envNameProblem(k string) string {
	if len(k) > maxEnvName || !envName.MatchString(k) {
		return "not a valid name"
	}
	up := strings.ToUpper(k)
	if deniedEnv[up] || strings.HasSuffix(up, "_PROXY") {
		return "reserved"
	}
	for _, p := range deniedEnvPrefixes {
		if strings.HasPrefix(up, p) {
			return "reserved"
		}
	}
	return ""
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// lookPath finds the executable file as a shell would with the kernel's
// PATH (only absolute entries count). A name holding a slash is made
// absolute against the gateway's working directory.
func lookPath(file, path string) (string, error) {
	if strings.Contains(file, "/") {
		abs, err := filepath.Abs(file)
		if err != nil {
			return "", err
		}
		return abs, isExecutable(abs)
	}
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, file)
		if isExecutable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q not found in PATH %s", file, path)
}

func isExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}

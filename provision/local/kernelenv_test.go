//go:build linux

package local

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kernelgate/internal/testkernels"

	"kernelgate/jupyter"
)

// startWith starts a kernel with prov and cfg and shuts it down when the
// test ends.
func startWith(t *testing.T, prov jupyter.Provisioner, cfg jupyter.Config) *jupyter.Kernel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	k, err := jupyter.Start(ctx, prov, cfg)
	if err != nil {
		t.Fatalf("start %s: %v", cfg.Spec.Name, err)
	}
	t.Cleanup(func() { k.Shutdown(context.Background()) })
	return k
}

// stdout runs Python code that must succeed and returns what it printed.
func stdout(t *testing.T, k *jupyter.Kernel, code string) string {
	t.Helper()
	reply, c := execute(t, k, code)
	if r := replyOf(t, reply); r.Status != "ok" {
		t.Fatalf("%q: reply %+v, output %q", code, r, streams(c))
	}
	return streams(c)
}

func streams(c *collector) string {
	var b strings.Builder
	for _, m := range c.ofType(jupyter.StreamMsg) {
		var s bundle
		if m.DecodeContent(&s) == nil {
			b.WriteString(s.Text)
		}
	}
	return b.String()
}

// kernelEnv returns a Python kernel's os.environ.
func kernelEnv(t *testing.T, k *jupyter.Kernel) map[string]string {
	t.Helper()
	out := stdout(t, k, "import os, json; print(json.dumps(dict(os.environ)))")
	var env map[string]string
	if err := json.Unmarshal([]byte(out), &env); err != nil {
		t.Fatalf("environ %q: %v", out, err)
	}
	return env
}

func TestKernelEnvironmentIsClean(t *testing.T) {
	t.Setenv("KERNELGATE_TOKEN", "secret")
	t.Setenv("SOME_GATEWAY_VAR", "x")
	spec := testkernels.Spec(t, "python3")
	prov := &Provisioner{RuntimeDir: t.TempDir()}
	k := startWith(t, prov, jupyter.Config{Spec: spec, Env: map[string]string{"KERNEL_USERNAME": "ada"}})
	env := kernelEnv(t, k)

	allowed := CleanEnv(KernelDirs{})
	for name := range spec.Env {
		allowed[name] = ""
	}
	// What the launch adds, and what ipykernel and IPython set themselves.
	for _, name := range []string{"KERNEL_USERNAME", "JPY_PARENT_PID", "MPLBACKEND", "CLICOLOR", "PAGER", "GIT_PAGER", "PYDEVD_USE_FRAME_EVAL"} {
		allowed[name] = ""
	}
	for name, v := range env {
		if _, ok := allowed[name]; !ok {
			t.Errorf("kernel has %s=%q, which is not in the clean environment", name, v)
		}
	}
	for _, name := range []string{"KERNELGATE_TOKEN", "SOME_GATEWAY_VAR"} {
		if v, ok := env[name]; ok {
			t.Errorf("gateway variable %s=%q reached the kernel", name, v)
		}
	}
	if env["PATH"] != DefaultKernelPath || env["KERNEL_USERNAME"] != "ada" {
		t.Errorf("PATH=%q KERNEL_USERNAME=%q", env["PATH"], env["KERNEL_USERNAME"])
	}

	// Every state directory is the kernel's own and dies with it.
	dirs := []string{"HOME", "IPYTHONDIR", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "MPLCONFIGDIR", "DENO_DIR", "TMPDIR"}
	root := filepath.Dir(env["HOME"])
	if !within(root, prov.RuntimeDir) || root == prov.RuntimeDir {
		t.Fatalf("HOME %q is not in a kernel directory of the runtime dir %s", env["HOME"], prov.RuntimeDir)
	}
	for _, name := range dirs {
		if !within(env[name], root) {
			t.Errorf("%s=%q is not in the kernel's directory %s", name, env[name], root)
		}
	}
	cwd := stdout(t, k, "import os; print(os.getcwd())")
	if !within(strings.TrimSpace(cwd), root) {
		t.Errorf("cwd %q is not in the kernel's directory", cwd)
	}
	k.Shutdown(context.Background())
	for _, name := range []string{"HOME", "IPYTHONDIR"} {
		if _, err := os.Stat(env[name]); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s %s survived the kernel: %v", name, env[name], err)
		}
	}
}

// A kernel writes IPython startup and config files, a .pth file and
// cwd config; the next kernel of the same provisioner obeys none of them.
func TestKernelStateDirsAreFresh(t *testing.T) {
	spec := testkernels.Spec(t, "python3")
	prov := &Provisioner{RuntimeDir: t.TempDir()}
	plant := `
import os, site, subprocess, sys
prof = os.path.join(os.environ["IPYTHONDIR"], "profile_default")
os.makedirs(os.path.join(prof, "startup"), exist_ok=True)
open(os.path.join(prof, "startup", "00-pwn.py"), "w").write("pwned = 'startup'\n")
for name in ("ipython_config.py", "ipython_kernel_config.py"):
    open(os.path.join(prof, name), "w").write("c.InteractiveShellApp.exec_lines = ['pwned = \"config\"']\n")
    open(name, "w").write("c.InteractiveShellApp.exec_lines = ['pwned = \"cwd\"']\n")
os.makedirs(site.getusersitepackages(), exist_ok=True)
open(os.path.join(site.getusersitepackages(), "pwn.pth"), "w").write("import builtins; builtins.pwned = 'pth'\n")
# Control: a new interpreter with this kernel's environment obeys them.
print(subprocess.run([sys.executable, "-c", "import builtins; print(getattr(builtins, 'pwned', None))"], capture_output=True, text=True).stdout.strip())
print(subprocess.run([sys.executable, "-c", "from IPython import start_ipython; start_ipython(argv=['-c', 'print(pwned)'])"], capture_output=True, text=True).stdout.strip())
`
	first := startWith(t, prov, jupyter.Config{Spec: spec})
	if got := strings.SplitN(stdout(t, first, plant), "\n", 2); len(got) != 2 || got[0] != "pth" || !strings.Contains(got[1], "config") {
		t.Fatalf("control: planted files not obeyed by a new interpreter in the same dirs: %q", got)
	}
	first.Shutdown(context.Background())

	second := startWith(t, prov, jupyter.Config{Spec: spec})
	got := stdout(t, second, "import builtins; print(repr(globals().get('pwned', getattr(builtins, 'pwned', None))))")
	if strings.TrimSpace(got) != "None" {
		t.Errorf("the next kernel ran planted code: pwned = %s", got)
	}
}

func TestLaunchRefusesReservedEnv(t *testing.T) {
	prov := &Provisioner{RuntimeDir: t.TempDir()}
	before := len(children())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := jupyter.Start(ctx, prov, jupyter.Config{Spec: testkernels.Spec(t, "python3"), Env: map[string]string{"LD_PRELOAD": "/tmp/evil.so"}})
	var envErr *EnvError
	if !errors.Is(err, jupyter.ErrEnvNotAllowed) || !errors.Is(err, jupyter.ErrStartFailed) || !errors.As(err, &envErr) || envErr.Name != "LD_PRELOAD" {
		t.Fatalf("err = %v, want an EnvError for LD_PRELOAD", err)
	}
	if strings.Contains(err.Error(), "evil") {
		t.Errorf("error repeats the value: %v", err)
	}
	if n := len(children()); n > before {
		t.Errorf("a process was started")
	}
	if entries, _ := os.ReadDir(prov.RuntimeDir); len(entries) != 0 {
		t.Errorf("runtime dir holds %d entries", len(entries))
	}
}

func TestValidateEnv(t *testing.T) {
	denied := []string{
		"LD_PRELOAD", "LD_LIBRARY_PATH", "ld_preload", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP",
		"PYTHONWARNINGS", "PYTHONBREAKPOINT", "PYTHONINSPECT", "IPYTHONDIR", "JUPYTER_CONFIG_DIR",
		"JUPYTER_PATH", "JUPYTER_RUNTIME_DIR", "HOME", "PATH", "Path", "DENO_DIR", "DENO_V8_FLAGS",
		"DENO_AUTH_TOKENS", "DENO_CERT", "NODE_OPTIONS", "NODE_PATH", "HTTP_PROXY", "https_proxy",
		"ALL_PROXY", "no_proxy", "BASH_ENV", "BASH_FUNC_x", "ENV", "SHELL", "IFS", "MPLCONFIGDIR",
		"MPLBACKEND", "TMPDIR", "KERNELGATE_TOKEN", "JPY_PARENT_PID", "JPY_SESSION_NAME",
		"GCONV_PATH", "GLIBC_TUNABLES", "KUBERNETES_SERVICE_HOST", "XDG_CONFIG_HOME", "VIRTUAL_ENV",
		"MALLOC_CHECK_", "PERL5OPT", "RUBYOPT", "JULIA_DEPOT_PATH", "R_PROFILE_USER", "CONDA_PREFIX",
		"JAVA_TOOL_OPTIONS", "LOCPATH", "TZDIR",
	}
	for _, name := range denied {
		t.Run("denied "+name, func(t *testing.T) {
			err := ValidateEnv(map[string]string{"OK": "1", name: "x"})
			var e *EnvError
			if !errors.Is(err, jupyter.ErrEnvNotAllowed) || !errors.As(err, &e) || e.Name != name {
				t.Errorf("ValidateEnv(%s) = %v, want an EnvError naming it", name, err)
			}
		})
	}
	bad := []struct {
		name string
		env  map[string]string
	}{
		{"empty name", map[string]string{"": "x"}},
		{"leading digit", map[string]string{"1X": "x"}},
		{"dash", map[string]string{"A-B": "x"}},
		{"equals", map[string]string{"A=B": "x"}},
		{"space", map[string]string{"A B": "x"}},
		{"newline in name", map[string]string{"A\nB": "x"}},
		{"non-ASCII", map[string]string{"ÄB": "x"}},
		{"long name", map[string]string{strings.Repeat("A", 200): "x"}},
		{"NUL", map[string]string{"A": "x\x00y"}},
		{"CR", map[string]string{"A": "x\ry"}},
		{"LF", map[string]string{"A": "x\ny"}},
		{"long value", map[string]string{"A": strings.Repeat("x", MaxEnvValue+1)}},
		{"too many", func() map[string]string {
			m := map[string]string{}
			for i := 0; i <= MaxEnvVars; i++ {
				m["V"+strings.Repeat("X", i)] = "1"
			}
			return m
		}()},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			if err := ValidateEnv(c.env); !errors.Is(err, jupyter.ErrEnvNotAllowed) {
				t.Errorf("ValidateEnv = %v, want ErrEnvNotAllowed", err)
			}
		})
	}
	good := []map[string]string{
		nil,
		{"KERNEL_USERNAME": "ada", "KERNEL_WORKING_DIR": "/work"},
		{"OMP_NUM_THREADS": "2", "TZ": "Europe/Paris", "LC_ALL": "C.UTF-8", "MY_API_URL": "https://example.com/?a=$b`c`"},
		{"_private": "", "a1": strings.Repeat("x", MaxEnvValue)},
		{"PROXY": "x", "PYTH": "x", "R": "x", "LDX": "x", "HOMEDIR": "x"},
	}
	for _, env := range good {
		if err := ValidateEnv(env); err != nil {
			t.Errorf("ValidateEnv(%v) = %v, want nil", env, err)
		}
	}
}

//go:build linux

package local

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// unprivilegedEnv marks a test binary that runUnprivileged started.
const unprivilegedEnv = "KERNELGATE_TEST_UNPRIVILEGED"

// unprivilegedChild reports whether this test binary is runUnprivileged's.
func unprivilegedChild() bool { return os.Getenv(unprivilegedEnv) == "1" }

// runUnprivileged runs the test named name again, in a copy of this test
// binary started as nobody (the test runs as root), so that what a gateway
// running as an ordinary user does is tested where the tests run as root,
// as in CI. It fails t unless that test ran and passed; the environment,
// KERNELGATE_REQUIRE_ALL and KERNELGATE_ZYGOTE included, is passed on.
func runUnprivileged(t *testing.T, name string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("runUnprivileged needs root")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The go tool's build directory is root's alone: the copy lives in a
	// directory of nobody's, which is its TMPDIR and HOME too.
	// A short name: kernels bind unix sockets below it (108 bytes a path).
	dir, err := os.MkdirTemp("/tmp", "kgu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, filepath.Base(exe))
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run", "^"+name+"$", "-test.count=1", "-test.v")
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "HOME" && k != "TMPDIR" && k != unprivilegedEnv {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "HOME="+dir, "TMPDIR="+dir, unprivilegedEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	t.Logf("%s as uid %d:\n%s", name, nobody, out)
	if err != nil {
		t.Fatalf("%s as uid %d: %v", name, nobody, err)
	}
	if !bytes.Contains(out, []byte("--- PASS: "+name+" ")) {
		t.Fatalf("%s did not run and pass as uid %d", name, nobody)
	}
}

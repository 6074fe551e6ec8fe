//go:build linux

package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/needs"
	"kernelgate/internal/testkernels"

	"kernelgate/jupyter"
)

func TestSandboxUserIDs(t *testing.T) {
	euid, egid := os.Geteuid(), os.Getegid()
	cases := []struct {
		name     string
		root     bool // the case is for a gateway running as root
		uid, gid int
		want     sandboxUser
		fails    bool
	}{
		{"root, unset", true, 0, 0, sandboxUser{nobody, nobody, true}, false},
		{"root, uid only", true, 1000, 0, sandboxUser{1000, nobody, true}, false},
		{"root, both", true, 1000, 1001, sandboxUser{1000, 1001, true}, false},
		{"root, negative", true, -1, 0, sandboxUser{}, true},
		{"not root, unset", false, 0, 0, sandboxUser{euid, egid, false}, false},
		{"not root, own", false, euid, egid, sandboxUser{euid, egid, false}, false},
		{"not root, other", false, euid + 1, 0, sandboxUser{}, true},
	}
	for _, c := range cases {
		if c.root != (euid == 0) {
			continue // run as root, or as nobody below
		}
		t.Run(c.name, func(t *testing.T) {
			got, err := (&SandboxConfig{UID: c.uid, GID: c.gid}).user()
			if c.fails {
				if err == nil {
					t.Errorf("user() = %+v, want an error", got)
				}
				return
			}
			if err != nil || got != c.want {
				t.Errorf("user() = %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
	switch {
	case euid == 0:
		t.Run("unprivileged gateway", func(t *testing.T) { runUnprivileged(t, "TestSandboxUserIDs") })
	case !unprivilegedChild():
		needs.Skip(t, "the cases of a root gateway need root: the test runs as uid %d", euid)
	}
}

// needRoot skips a test of what a root gateway does for its sandbox user.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		needs.Skip(t, "the gateway runs sandboxed kernels as another user only as root")
	}
}

// ownerOf returns the uid and gid of path and its permission bits.
func ownerOf(t *testing.T, path string) (uid, gid int, perm fs.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return int(st.Uid), int(st.Gid), fi.Mode().Perm()
}

func TestHandOver(t *testing.T) {
	needRoot(t)
	runtime := t.TempDir()
	os.Chmod(runtime, 0o700)
	dir := filepath.Join(runtime, "kernel-1")
	os.Mkdir(dir, 0o700)
	kd, err := newKernelDirs(filepath.Join(dir, "kernel"))
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(kd.Home, ".config", "matplotlib"), 0o700)
	os.WriteFile(filepath.Join(kd.Home, ".config", "matplotlib", "fontlist.json"), []byte("{}"), 0o600)
	os.WriteFile(filepath.Join(kd.Root, "kernel-1.json"), []byte("{}"), 0o600)
	os.Mkdir(filepath.Join(dir, "gw"), 0o700)

	u := sandboxUser{uid: 4242, gid: 4343, switched: true}
	if err := u.handOver(runtime, kd); err != nil {
		t.Fatal(err)
	}
	filepath.WalkDir(kd.Root, func(p string, _ fs.DirEntry, err error) error {
		if uid, gid, _ := ownerOf(t, p); uid != u.uid || gid != u.gid {
			t.Errorf("%s belongs to %d:%d, want %s", p, uid, gid, u)
		}
		return err
	})
	for _, c := range []struct {
		path string
		perm fs.FileMode
	}{{runtime, 0o711}, {dir, 0o711}, {filepath.Join(dir, "gw"), 0o700}} {
		if uid, _, perm := ownerOf(t, c.path); uid != 0 || perm != c.perm {
			t.Errorf("%s: owner %d, mode %o; want root's, %o", c.path, uid, perm, c.perm)
		}
	}
}

// hostDir is a directory outside /tmp (which every sandbox replaces),
// removed when the test ends.
func hostDir(t *testing.T) string {
	t.Helper()
	for _, parent := range []string{"/var/lib", os.Getenv("HOME")} {
		if parent == "" {
			continue
		}
		if dir, err := os.MkdirTemp(parent, "kernelgate-test-"); err == nil {
			t.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	needs.Skip(t, "no writable directory outside /tmp")
	return ""
}

// A root gateway looks paths up as the sandbox user: a hidden path that
// user cannot reach is left alone (bwrap could not mount over it, and the
// kernel cannot read it anyway), and a working directory it cannot enter
// fails the launch.
func TestBwrapArgsAsSandboxUser(t *testing.T) {
	needRoot(t)
	private := hostDir(t) // 0700, root's
	secret := filepath.Join(private, "keys")
	os.WriteFile(secret, []byte("x"), 0o600)
	open := filepath.Join(hostDir(t), "visible")
	os.WriteFile(open, []byte("x"), 0o600)
	os.Chmod(filepath.Dir(open), 0o755)

	runtime := sandboxRuntime(t)
	os.Mkdir(filepath.Join(runtime, "kernel-1"), 0o700)
	kd, err := newKernelDirs(filepath.Join(runtime, "kernel-1", "kernel"))
	if err != nil {
		t.Fatal(err)
	}
	u := sandboxUser{uid: nobody, gid: nobody, switched: true}
	if err := u.handOver(runtime, kd); err != nil {
		t.Fatal(err)
	}
	cfg := &SandboxConfig{Hide: []string{secret, open}}
	args, err := cfg.bwrapArgs(u, runtime, kd, kd.Work, kd.Work, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Join(args, " ")
	if strings.Contains(line, secret) {
		t.Errorf("bwrap is to hide %s, which the sandbox user cannot reach: %s", secret, line)
	}
	if !strings.Contains(line, "--ro-bind "+emptyFile(kd)+" "+open) {
		t.Errorf("bwrap does not hide %s: %s", open, line)
	}
	if _, err := cfg.bwrapArgs(u, runtime, kd, private, private, "", 0); err == nil || !strings.Contains(err.Error(), "cannot enter "+private) {
		t.Errorf("working directory %s (0700, root's): err = %v, want cannot enter", private, err)
	}
}

// unprivilegedProbe prints, as JSON, who the kernel is, what it reads of
// the host's secrets and of the file SECRET, and where it may write.
const unprivilegedProbe = `
import json, os
def read(p):
    try:
        with open(p) as f:
            return 'read %d bytes' % len(f.read())
    except OSError as e:
        return type(e).__name__
def write(d):
    try:
        with open(os.path.join(d, 'probe'), 'w') as f:
            f.write('x')
        return 'ok'
    except OSError as e:
        return type(e).__name__
print(json.dumps({
    'uid': os.getuid(), 'gid': os.getgid(), 'root_group': 0 in os.getgroups(), 'userns': os.readlink('/proc/self/ns/user'),
    'shadow': read('/etc/shadow'), 'gshadow': read('/etc/gshadow'), 'secret': read(SECRET),
    'home': write(os.environ['HOME']), 'tmpdir': write(os.environ['TMPDIR']), 'cwd': write(os.getcwd()), 'tmp': write('/tmp'),
}))`

type unprivileged struct {
	UID       int    `json:"uid"`
	GID       int    `json:"gid"`
	RootGroup bool   `json:"root_group"`
	UserNS    string `json:"userns"`
	Shadow    string `json:"shadow"`
	GShadow   string `json:"gshadow"`
	Secret    string `json:"secret"`
	Home      string `json:"home"`
	TmpDir    string `json:"tmpdir"`
	Cwd       string `json:"cwd"`
	Tmp       string `json:"tmp"`
}

// A sandboxed kernel of a root gateway runs as nobody: it reads no root
// secret (the hidden /etc/shadow, a root-owned 0600 file in its working
// directory) and writes only its own directories; a working directory it
// may not write is bound all the same. One of a gateway running as an
// ordinary user runs as that user, in a user namespace of its own, and
// reads no /etc/shadow either: run as nobody when the test runs as root.
func TestSandboxedKernelIsUnprivileged(t *testing.T) {
	needSandbox(t)
	if os.Geteuid() == 0 {
		t.Run("unprivileged gateway", func(t *testing.T) { runUnprivileged(t, "TestSandboxedKernelIsUnprivileged") })
	}
	wantUID, wantGID := os.Geteuid(), os.Getegid()
	if wantUID == 0 {
		wantUID, wantGID = nobody, nobody
	}
	runtime := sandboxRuntime(t)
	os.Chmod(runtime, 0o700) // as the provisioner makes it
	ws := t.TempDir()        // 0755, root's, beside the runtime dir
	const secret = "kg-sandbox-user-secret"
	if err := os.WriteFile(filepath.Join(ws, "secret"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	prov := &Provisioner{RuntimeDir: runtime, Transport: "ipc", Sandbox: &SandboxConfig{}}
	spec := testkernels.Spec(t, "python3")
	probe := func(t *testing.T, k *jupyter.Kernel) unprivileged {
		t.Helper()
		var got unprivileged
		out := stdout(t, k, fmt.Sprintf("SECRET = %q\n", filepath.Join(ws, "secret"))+unprivilegedProbe)
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("probe printed %q: %v", out, err)
		}
		t.Logf("%+v", got)
		if got.UID != wantUID || got.GID != wantGID || (got.RootGroup && wantGID != 0) {
			t.Errorf("kernel runs as %d:%d (root group %v), want %d:%d", got.UID, got.GID, got.RootGroup, wantUID, wantGID)
		}
		// bwrap, started as the sandbox user, made a user namespace.
		if own, _ := os.Readlink("/proc/self/ns/user"); got.UserNS == own {
			t.Errorf("the kernel shares the gateway's user namespace %s", own)
		}
		for name, r := range map[string]string{"/etc/shadow": got.Shadow, "/etc/gshadow": got.GShadow} {
			if exists(name) && r != "PermissionError" {
				t.Errorf("reading %s: %s, want PermissionError", name, r)
			}
		}
		if got.Home != "ok" || got.TmpDir != "ok" || got.Tmp != "ok" {
			t.Errorf("writes to HOME, TMPDIR, /tmp: %s %s %s, want ok", got.Home, got.TmpDir, got.Tmp)
		}
		return got
	}

	t.Run("own directories", func(t *testing.T) {
		k := startWith(t, prov, jupyter.Config{Spec: spec})
		if got := probe(t, k); got.Cwd != "ok" {
			t.Errorf("write to the working directory: %s, want ok", got.Cwd)
		}
		_, c := execute(t, k, "1+1")
		if got := plainText(t, contentOf(t, c.await(t, jupyter.ExecuteResult, time.Second))); got != "2" {
			t.Errorf("1+1 = %q", got)
		}
		if os.Geteuid() != 0 {
			return
		}
		lp := k.Process().(*localProcess)
		kd := filepath.Join(lp.dir, "kernel")
		for _, p := range []string{kd, filepath.Join(kd, "home"), filepath.Join(kd, "work"), filepath.Join(kd, "tmp")} {
			if uid, gid, _ := ownerOf(t, p); uid != nobody || gid != nobody {
				t.Errorf("%s belongs to %d:%d, want the sandbox user's", p, uid, gid)
			}
		}
		for _, c := range []struct {
			path string
			perm fs.FileMode
		}{{runtime, 0o711}, {lp.dir, 0o711}, {filepath.Join(lp.dir, "empty"), 0o444}, {filepath.Join(lp.dir, "sealed"), 0}} {
			if uid, _, perm := ownerOf(t, c.path); uid != 0 || perm != c.perm {
				t.Errorf("%s: owner %d, mode %o; want root's, %o", c.path, uid, perm, c.perm)
			}
		}
	})
	t.Run("root's working directory", func(t *testing.T) {
		k := startWith(t, prov, jupyter.Config{Spec: spec, Cwd: ws})
		got := probe(t, k)
		if os.Geteuid() == 0 && (got.Secret != "PermissionError" || got.Cwd != "PermissionError") {
			t.Errorf("root's 0600 file in the working directory: %s, writing there: %s; want PermissionError for both", got.Secret, got.Cwd)
		}
		if b, _ := os.ReadFile(filepath.Join(ws, "secret")); string(b) != secret {
			t.Errorf("the secret changed: %q", b)
		}
	})
	t.Run("deno", func(t *testing.T) {
		// Deno speaks tcp only: the gateway reaches it through the bridge,
		// entering the network namespace of the sandbox's user namespace,
		// which only root may do; another gateway gives it the network.
		prov := &Provisioner{RuntimeDir: runtime, Sandbox: &SandboxConfig{}}
		if os.Geteuid() != 0 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if k, err := jupyter.Start(ctx, prov, jupyter.Config{Spec: testkernels.Spec(t, "deno")}); !errors.Is(err, jupyter.ErrStartFailed) || !strings.Contains(err.Error(), "only a gateway running as root") {
				if k != nil {
					k.Shutdown(context.Background())
				}
				t.Fatalf("a sandboxed Deno without network, started as uid %d: %v; want ErrStartFailed saying it needs root", os.Geteuid(), err)
			}
			prov = &Provisioner{RuntimeDir: runtime, Sandbox: &SandboxConfig{Network: true}}
		}
		k := startWith(t, prov, jupyter.Config{Spec: testkernels.Spec(t, "deno")})
		cases := []struct{ name, code, want string }{
			{"uid", "Deno.uid() + ':' + Deno.gid()", fmt.Sprintf(`"%d:%d"`, wantUID, wantGID)},
			{"/etc/shadow", `let r; try { r = "read " + Deno.readTextFileSync("/etc/shadow").length + " bytes" } catch (e) { r = e.name }; r`, `"PermissionDenied"`},
			{"HOME", `Deno.writeTextFileSync(Deno.env.get("HOME") + "/probe", "xy"); Deno.readTextFileSync(Deno.env.get("HOME") + "/probe").length`, "2"},
			{"result", "1+1", "2"},
		}
		for _, c := range cases {
			if c.name == "/etc/shadow" && !exists("/etc/shadow") {
				continue
			}
			_, col := execute(t, k, c.code)
			if got := plainText(t, contentOf(t, col.await(t, jupyter.ExecuteResult, 2*time.Second))); got != c.want {
				t.Errorf("%s: %s = %s, want %s", c.name, c.code, got, c.want)
			}
		}
		if os.Geteuid() == 0 {
			// The bridge's sockets are the gateway's alone.
			gw := filepath.Join(k.Process().(*localProcess).dir, "gw")
			if uid, _, perm := ownerOf(t, gw); uid != 0 || perm != 0o700 {
				t.Errorf("%s: owner %d, mode %o; want root's, 700", gw, uid, perm)
			}
		}
	})
}

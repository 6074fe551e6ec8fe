//go:build linux

package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kernelgate/internal/testkernels"
	"kernelgate/jupyter"
)

// commandOutput runs argv beside k with env and returns its stdout and
// exit code.
func commandOutput(t *testing.T, k *jupyter.Kernel, env map[string]string, argv ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := k.StartCommand(ctx, jupyter.CommandRequest{Argv: argv, Env: env})
	if err != nil {
		t.Fatalf("command %q: %v", argv, err)
	}
	out, _ := io.ReadAll(c.Stdout())
	c.Stdout().Close()
	io.Copy(io.Discard, c.Stderr())
	c.Stderr().Close()
	return string(out), c.ExitCode()
}

// TestAdoptedKernelStartsCommands: a detached kernel, exec'd and forked
// alike, adopted by another provisioner from its info starts commands
// as before: the kernel's environment (its HOME, the gateway's
// directories) under the caller's variables, its working directory,
// exit codes. The launch request's variables, which may be secrets, are
// not in the info. The info of an earlier version, without the command
// plan, adopts a kernel that answers jupyter.ErrNoCommands.
func TestAdoptedKernelStartsCommands(t *testing.T) {
	for _, launcher := range []string{LauncherExec, LauncherFork} {
		t.Run(launcher, func(t *testing.T) {
			root := t.TempDir()
			p := &Provisioner{RuntimeDir: root, Detached: true, PythonLauncher: launcher}
			reg := jupyter.NewRegistry(Name)
			reg.Register(Name, p)
			reg.Alias(InfoName, Name)
			spec := testkernels.Spec(t, "python3")
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cwd := t.TempDir()
			cfg := jupyter.Config{Spec: spec, Cwd: cwd,
				Env:    map[string]string{"CLIENT_SECRET": "s3cret-value-kg"},
				DirEnv: map[string]string{"KG_CACHE_DIR": filepath.Join(cwd, ".cache")}}
			k1, err := jupyter.Start(ctx, reg, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := resultText(t, k1, "import os\nopen('from-kernel.txt', 'w').write('hi')\nos.environ['HOME']"); !strings.Contains(got, root) {
				t.Fatalf("HOME %s", got)
			}
			probe := []string{"/bin/sh", "-c", `cat from-kernel.txt; echo; pwd; echo "$HOME|$KG_CACHE_DIR|$CLIENT_SECRET"; exit 4`}
			env := map[string]string{"CLIENT_SECRET": "s3cret-value-kg"}
			before, code := commandOutput(t, k1, env, probe...)
			if code != 4 || !strings.HasPrefix(before, "hi\n"+cwd+"\n") || !strings.HasSuffix(before, "|s3cret-value-kg\n") {
				t.Fatalf("a command before adoption: %d %q", code, before)
			}
			info, err := k1.ProvisionerInfo()
			if err != nil {
				k1.Shutdown(ctx)
				t.Fatal(err)
			}
			if bytes.Contains(info.Data, []byte("s3cret-value-kg")) {
				t.Errorf("the kernel's info holds a variable of its launch request: %s", info.Data)
			}
			k1.Detach()
			// Whatever fails below, the kernel ends with the test.
			t.Cleanup(func() { jupyter.Stop(context.Background(), reg, info, time.Second) })

			p2 := &Provisioner{RuntimeDir: root, Detached: true, PythonLauncher: launcher}
			reg2 := jupyter.NewRegistry(Name)
			reg2.Register(Name, p2)
			reg2.Alias(InfoName, Name)
			k2, err := jupyter.Reconnect(ctx, reg2, info, jupyter.Config{ID: k1.ID(), Spec: spec})
			if err != nil {
				jupyter.Stop(context.Background(), reg2, info, time.Second)
				t.Fatalf("not adopted: %v", err)
			}
			after, code := commandOutput(t, k2, env, probe...)
			if code != 4 || after != before {
				t.Errorf("a command beside the adopted kernel: %d %q, want 4 %q", code, after, before)
			}
			k2.Detach()

			// The info an earlier version wrote: no "command".
			var data map[string]json.RawMessage
			if err := json.Unmarshal(info.Data, &data); err != nil || data["command"] == nil {
				t.Fatalf("info %s: %v", info.Data, err)
			}
			delete(data, "command")
			old := info
			old.Data, _ = json.Marshal(data)
			k3, err := jupyter.Reconnect(ctx, reg2, old, jupyter.Config{ID: k1.ID(), Spec: spec})
			if err != nil {
				jupyter.Stop(context.Background(), reg2, info, time.Second)
				t.Fatalf("the info of an earlier version was not adopted: %v", err)
			}
			defer k3.Shutdown(context.Background())
			if got := resultText(t, k3, "open('from-kernel.txt').read()"); got != "'hi'" {
				t.Errorf("the kernel adopted from the earlier info: %s", got)
			}
			if _, err := k3.StartCommand(ctx, jupyter.CommandRequest{Argv: []string{"true"}}); !errors.Is(err, jupyter.ErrNoCommands) {
				t.Errorf("a command beside a kernel of an earlier version's info: %v, want ErrNoCommands", err)
			}
		})
	}
}

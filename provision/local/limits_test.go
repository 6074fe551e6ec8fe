//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"kernelgate/internal/needs"
	"kernelgate/internal/testkernels"

	"kernelgate/jupyter"
)

// needCgroups skips the test when the machine offers no writable cgroup
// hierarchy with the controllers.
func needCgroups(t *testing.T, controllers ...string) {
	t.Helper()
	host, err := hostCgroups()
	if err != nil {
		needs.Skip(t, "cgroups not available: %v", err)
	}
	for _, c := range controllers {
		if contains(host.missing, c) {
			needs.Skip(t, "cgroup controller %s not available", c)
		}
	}
}

func TestMemoryLimitKillsKernel(t *testing.T) {
	needCgroups(t, "memory")
	cases := []struct {
		name    string
		sandbox *SandboxConfig
		forked  bool
	}{
		{"plain", nil, false},
		{"sandboxed", &SandboxConfig{}, false},
		{"forked", nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.sandbox != nil {
				needSandbox(t)
			}
			spec := testkernels.Spec(t, "python3")
			if c.forked {
				spec = forkSpec(t)
			}
			prov := &Provisioner{RuntimeDir: sandboxRuntime(t), Sandbox: c.sandbox}
			small := startWith(t, prov, jupyter.Config{Spec: spec, Options: &Options{Limits: &Limits{MemoryBytes: 512 << 20}}})
			big := startWith(t, prov, jupyter.Config{Spec: spec})
			checkForked(t, c.forked, small, big)

			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			_, err := small.Execute(ctx, "x = bytearray(2*1024**3)", nil)
			var died *jupyter.DiedError
			if !errors.As(err, &died) {
				t.Fatalf("execute: err = %v, want a DiedError", err)
			}
			t.Logf("died: %v", died)
			if died.Reason != ReasonOutOfMemory || !strings.Contains(died.Error(), "out of memory") {
				t.Errorf("DiedError = %v (reason %q), want reason %q", died, died.Reason, ReasonOutOfMemory)
			}
			if !errors.As(small.Err(), &died) || died.Reason != ReasonOutOfMemory {
				t.Errorf("Kernel.Err() = %v, want a DiedError saying out of memory", small.Err())
			}
			_, col := execute(t, big, "1+1")
			if got := plainText(t, contentOf(t, col.await(t, jupyter.ExecuteResult, 2*time.Second))); got != "2" {
				t.Errorf("other kernel: 1+1 = %q", got)
			}
		})
	}
}

// forkBomb forks sleeping children until fork fails, then kills and reaps
// them and re-raises the failure.
const forkBomb = `
import os, signal, time
forked = []
try:
    for i in range(200):
        pid = os.fork()
        if pid == 0:
            try:
                time.sleep(30)
            finally:
                os._exit(0)
        forked.append(pid)
finally:
    for pid in forked:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
`

func TestPidsLimitStopsForkBomb(t *testing.T) {
	needCgroups(t, "pids")
	cases := []struct {
		name    string
		sandbox *SandboxConfig
		forked  bool
	}{
		{"plain", nil, false},
		{"sandboxed", &SandboxConfig{}, false},
		{"forked", nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.sandbox != nil {
				needSandbox(t)
			}
			spec := testkernels.Spec(t, "python3")
			if c.forked {
				spec = forkSpec(t)
			}
			prov := &Provisioner{RuntimeDir: sandboxRuntime(t), Sandbox: c.sandbox, Limits: Limits{Pids: 64}}
			k := startWith(t, prov, jupyter.Config{Spec: spec})
			checkForked(t, c.forked, k)
			col := newCollector()
			call, err := k.StartExecute(keepGoing(forkBomb), col.handle)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			reply, err := call.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			r := replyOf(t, reply)
			if r.Status != "error" || r.EName != "BlockingIOError" {
				t.Fatalf("fork bomb reply = %+v, want error BlockingIOError", r)
			}
			if e := contentOf(t, col.await(t, jupyter.ErrorMsg, time.Second)); e.EName != "BlockingIOError" {
				t.Errorf("iopub error %q", e.EName)
			}
			n := strings.TrimSpace(stdout(t, k, "print(len(forked))"))
			t.Logf("forked %s children before EAGAIN", n)
			if n == "0" || n == "200" {
				t.Errorf("forked %s children, want some but fewer than 64", n)
			}
			if err := k.Err(); err != nil {
				t.Errorf("kernel died: %v", err)
			}
			_, after := execute(t, k, "1+1")
			if got := plainText(t, contentOf(t, after.await(t, jupyter.ExecuteResult, 2*time.Second))); got != "2" {
				t.Errorf("after the fork bomb 1+1 = %q", got)
			}
		})
	}
}

func TestRlimits(t *testing.T) {
	cases := []struct {
		name      string
		prov      Limits
		launch    *Limits
		wantFiles uint64
		forked    bool
	}{
		{"provisioner default", Limits{NoFile: 300}, nil, 300, false},
		{"launch overrides", Limits{NoFile: 300}, &Limits{NoFile: 400}, 400, false},
		{"forked", Limits{NoFile: 300}, &Limits{NoFile: 400}, 400, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := testkernels.Spec(t, "python3")
			if c.forked {
				spec = forkSpec(t)
			}
			prov := &Provisioner{RuntimeDir: t.TempDir(), Limits: c.prov}
			k := startWith(t, prov, jupyter.Config{Spec: spec, Options: &Options{Limits: c.launch}})
			checkForked(t, c.forked, k)
			got := strings.TrimSpace(stdout(t, k, "import resource as r; print(r.getrlimit(r.RLIMIT_NOFILE), r.getrlimit(r.RLIMIT_CORE))"))
			want := fmt.Sprintf("(%d, %d) (0, 0)", c.wantFiles, c.wantFiles)
			if got != want {
				t.Errorf("getrlimit NOFILE, CORE = %s, want %s", got, want)
			}
		})
	}
}

func TestLimitsAreValidated(t *testing.T) {
	prov := &Provisioner{RuntimeDir: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, l := range []Limits{{MemoryBytes: -1}, {Pids: -5}} {
		if _, err := jupyter.Start(ctx, prov, jupyter.Config{Spec: testkernels.Spec(t, "python3"), Options: &Options{Limits: &l}}); !errors.Is(err, jupyter.ErrStartFailed) {
			t.Errorf("limits %+v: err = %v, want ErrStartFailed", l, err)
		}
	}
}

func TestDiedErrorMessage(t *testing.T) {
	cases := []struct {
		e    jupyter.DiedError
		want string
	}{
		{jupyter.DiedError{}, "jupyter: kernel died"},
		{jupyter.DiedError{Status: "signal: killed", During: "request"}, "jupyter: kernel died during request (signal: killed)"},
		{jupyter.DiedError{Status: "exit status 137", Reason: ReasonOutOfMemory}, "jupyter: kernel died (out of memory: exit status 137)"},
		{jupyter.DiedError{Reason: ReasonOutOfMemory, Output: "bye\n"}, "jupyter: kernel died (out of memory): bye"},
	}
	for _, c := range cases {
		if got := c.e.Error(); got != c.want {
			t.Errorf("%+v.Error() = %q, want %q", c.e, got, c.want)
		}
	}
}

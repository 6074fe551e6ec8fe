package directclient

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/leakcheck"
	"kernelgate/internal/sysproc"
	"kernelgate/internal/testkernels"
	"kernelgate/kernelspecs"
)

func TestExecuteAndClose(t *testing.T) {
	cases := []struct{ kernel, fails string }{
		{"python3", "1/0"},
		{"deno", "throw new Error('boom')"},
	}
	for _, tc := range cases {
		t.Run(tc.kernel, func(t *testing.T) {
			spec := testkernels.Spec(t, tc.kernel)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			c, err := Start(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			pid, dir := c.PID(), c.dir
			for _, run := range []struct{ code, want string }{{"1+1", "ok"}, {tc.fails, "error"}} {
				status, err := c.Execute(ctx, run.code)
				if err != nil {
					c.Close()
					t.Fatalf("execute %q: %v", run.code, err)
				}
				if status != run.want {
					t.Errorf("execute %q: status %q, want %q", run.code, status, run.want)
				}
			}
			c.Close()
			c.Close() // idempotent
			if kids := children(); len(kids) != 0 {
				t.Errorf("child processes left after Close: %v", kids)
			}
			if err := sysproc.Kill(-pid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("process group %d still exists (kill: %v)", pid, err)
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("directory %s with the connection file not removed (%v)", dir, err)
			}
		})
	}
}

func TestStartFailure(t *testing.T) {
	spec := &kernelspecs.Spec{Name: "broken", Argv: []string{"/bin/sh", "-c", "echo no-kernel-here >&2; exit 3", "{connection_file}"}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := Start(ctx, spec)
	if !errors.Is(err, ErrKernelExited) || !strings.Contains(err.Error(), "no-kernel-here") {
		t.Errorf("err = %v, want ErrKernelExited with the kernel's output", err)
	}
	if kids := children(); len(kids) != 0 {
		t.Errorf("child processes left after a failed start: %v", kids)
	}
}

func children() []int { return leakcheck.Children() }

// A port taken between the choice and the kernel's bind (another process
// got it) only costs a second start on other ports.
func TestStartRetriesTakenPort(t *testing.T) {
	spec := testkernels.Spec(t, "python3")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	calls := 0
	pickPorts = func() ([5]int, error) {
		calls++
		ports, err := freePorts()
		if calls == 1 {
			ports[2] = taken.Addr().(*net.TCPAddr).Port // stdin: the kernel binds it, nobody dials it
		}
		return ports, err
	}
	defer func() { pickPorts = freePorts }()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Start(ctx, spec)
	if err != nil {
		t.Fatalf("start with a taken port: %v", err)
	}
	defer c.Close()
	if calls != 2 {
		t.Errorf("ports chosen %d times, want 2", calls)
	}
	if status, err := c.Execute(ctx, "1+1"); err != nil || status != "ok" {
		t.Errorf("execute: %q, %v", status, err)
	}
}

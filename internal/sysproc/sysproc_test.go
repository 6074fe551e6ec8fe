//go:build unix

package sysproc

import (
	"errors"
	"os/exec"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestGroupKill: a child started with GroupAttr leads a group of its own,
// which Kill with a negative pid signals; once reaped it is gone (ESRCH).
func TestGroupKill(t *testing.T) {
	cmd := exec.Command("/bin/sleep", "60")
	cmd.SysProcAttr = GroupAttr()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if pgid, err := syscall.Getpgid(pid); err != nil || pgid != pid {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child %d is in group %d (%v), want its own", pid, pgid, err)
	}
	if err := Kill(-pid, 0); err != nil {
		t.Errorf("Kill(-%d, 0) = %v, want nil while the group lives", pid, err)
	}
	if err := Kill(-pid, syscall.SIGKILL); err != nil {
		t.Fatalf("Kill(-%d, SIGKILL): %v", pid, err)
	}
	cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Errorf("child ended with %v, want SIGKILL", cmd.ProcessState)
	}
	if err := Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("Kill(%d, 0) after reaping = %v, want ESRCH", pid, err)
	}
}

// TestSessionAttr: a child started with SessionAttr leads a session of
// its own.
func TestSessionAttr(t *testing.T) {
	cmd := exec.Command("/bin/sleep", "60")
	cmd.SysProcAttr = SessionAttr()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer Kill(cmd.Process.Pid, syscall.SIGKILL)
	if sid, err := unix.Getsid(cmd.Process.Pid); err != nil || sid != cmd.Process.Pid {
		t.Errorf("child %d is in session %d (%v), want its own", cmd.Process.Pid, sid, err)
	}
}

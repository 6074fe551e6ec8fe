package sysproc

import (
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/windows"
)

// SignalInterrupts says whether SIGINT reaches a child: Windows has no
// signals between processes.
const SignalInterrupts = false

// GroupAttr starts a child in a process group of its own.
func GroupAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{CreationFlags: windows.CREATE_NEW_PROCESS_GROUP}
}

// SessionAttr starts a child in a process group of its own, without
// this process's console.
func SessionAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{CreationFlags: windows.CREATE_NEW_PROCESS_GROUP | windows.DETACHED_PROCESS}
}

// stillActive is the exit code of a process that has not ended.
const stillActive = 259

// Kill ends the process |pid| for SIGKILL and SIGTERM (a process group
// is the process alone here); 0 checks that it runs (ESRCH when it does
// not). Other signals are unsupported.
func Kill(pid int, sig syscall.Signal) error {
	if pid < 0 {
		pid = -pid
	}
	if sig != 0 && sig != syscall.SIGKILL && sig != syscall.SIGTERM {
		return fmt.Errorf("sysproc: signal %v: %w", sig, errors.ErrUnsupported)
	}
	h, err := windows.OpenProcess(windows.PROCESS_TERMINATE|windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(pid))
	if errors.Is(err, windows.ERROR_INVALID_PARAMETER) {
		return syscall.ESRCH // no such process
	}
	if err != nil {
		return err
	}
	defer windows.CloseHandle(h)
	var code uint32
	if err := windows.GetExitCodeProcess(h, &code); err != nil {
		return err
	}
	if code != stillActive {
		return syscall.ESRCH
	}
	if sig == 0 {
		return nil
	}
	return windows.TerminateProcess(h, 1)
}

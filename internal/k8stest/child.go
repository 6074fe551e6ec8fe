package k8stest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"kernelgate/internal/sysproc"
)

// child is one server process of the control plane. One goroutine owns
// cmd.Wait and closes done.
type child struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // set before done closes
}

func startChild(dir, name, bin string, args ...string) (*child, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// Own process group, and killed with the test process if it dies first.
	cmd.SysProcAttr = sysproc.GroupAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("k8stest: start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// stop sends SIGTERM, then SIGKILL after stopGrace, and waits for the exit.
// A nil child or one already stopped is fine.
func (c *child) stop() {
	if c == nil {
		return
	}
	select {
	case <-c.done:
		return
	default:
	}
	_ = sysproc.Kill(-c.cmd.Process.Pid, syscall.SIGTERM)
	timer := time.NewTimer(stopGrace)
	defer timer.Stop()
	select {
	case <-c.done:
	case <-timer.C:
		_ = sysproc.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.done
	}
}

// exitError describes an exit during start, with the end of the log.
func (c *child) exitError() error {
	tail := c.logTail()
	err := fmt.Errorf("k8stest: %s exited: %v\n%s", c.name, c.err, tail)
	if strings.Contains(tail, "address already in use") {
		return errors.Join(errAddrInUse, err)
	}
	return err
}

func (c *child) logTail() string {
	b, _ := os.ReadFile(c.log)
	return c.name + " log:\n" + lastLines(string(b), 20)
}

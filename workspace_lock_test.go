//go:build linux

package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestWorkspaceRootOneGateway: a second gateway on the workspace root of a
// live one (with a state directory of its own) refuses to start and says
// why, leaving the first one's files alone; after the first is killed
// with SIGKILL, a gateway restarted on the same root and state starts (the
// lock died with the process) and finds the context and its files.
func TestWorkspaceRootOneGateway(t *testing.T) {
	bin := buildBinary(t)
	root := filepath.Join(t.TempDir(), "workspaces")
	dirs := newRestartDirs(t)
	g := dirs.start(t, bin, "--pool-size", "0", "--workspace-root", root)
	call(t, "POST", g.url+"api/contexts", map[string]any{"id": "mine", "language": "python"}, 201, nil)
	execute(t, g.url, "mine", "open('kept.txt', 'w').write('kept')")
	kept := filepath.Join(root, "contexts", "mine", "kept.txt")
	if _, err := os.Stat(kept); err != nil {
		t.Fatalf("the context's file: %v", err)
	}

	// Another gateway, another state directory, the same root.
	other := exec.Command(bin, "serve", "--port", "0", "--kernelspec-dir", kernelsDir(t), "--pool-size", "0",
		"--state-dir", filepath.Join(t.TempDir(), "state"), "--runtime-dir", t.TempDir(), "--workspace-root", root)
	other.Env = append(os.Environ(), "XDG_STATE_HOME="+t.TempDir())
	var stderr bytes.Buffer
	other.Stderr = &stderr
	stdout, _ := other.StdoutPipe()
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	served := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "serving at ") {
				served <- sc.Text()
			}
		}
	}()
	exited := make(chan error, 1)
	go func() { exited <- other.Wait() }()
	select {
	case line := <-served:
		other.Process.Signal(syscall.SIGTERM)
		<-exited
		t.Fatalf("a second gateway started on the workspace root of a live one: %s\n%s", line, stderr.String())
	case err := <-exited:
		if err == nil || !strings.Contains(stderr.String(), "--workspace-root") || !strings.Contains(stderr.String(), "in use") {
			t.Fatalf("second gateway: exit %v, want a refusal naming --workspace-root:\n%s", err, stderr.String())
		}
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		t.Logf("second gateway refused: %s", lines[len(lines)-1])
	case <-time.After(60 * time.Second):
		other.Process.Kill()
		t.Fatalf("the second gateway neither started nor exited\n%s", stderr.String())
	}
	if b, err := os.ReadFile(kept); err != nil || string(b) != "kept" {
		t.Fatalf("the first gateway's file after the refused start: %q %v", b, err)
	}
	execute(t, g.url, "mine", "1") // the first one serves on

	// SIGKILL leaves no stale lock: the same gateway starts again.
	g.kill(t, syscall.SIGKILL)
	g2 := dirs.start(t, bin, "--pool-size", "0", "--workspace-root", root)
	if e := execute(t, g2.url, "mine", "open('kept.txt').read()"); e.text() != "'kept'" {
		t.Fatalf("after the restart: %+v", e)
	}
}

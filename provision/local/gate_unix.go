//go:build unix

package local

import (
	"os"
	"os/exec"
)

// parentPIDEnv: ipykernel reads JPY_PARENT_PID as its parent's pid and
// exits when its parent changes.
const parentPIDEnv = true

// Go's exec has no hook between fork and exec, so a kernel starts behind a
// gate: /bin/sh waits for one line on fd 3, then closes it and execs the
// kernel (or bwrap) in place, keeping its pid. While it waits the gateway
// moves that pid into the kernel's cgroups and sets its rlimits, so the
// kernel's first instruction already runs under every limit and every
// process it forks inherits them: there is no window. EOF on the gate (the
// gateway died or gave up) makes the shell exit without running anything.
// The shell's own PWD is not passed on.
const gateScript = `read -r go <&3 || exit 125; exec 3<&-; unset PWD; exec "$@"`

// gatedCommand returns a command that starts argv behind the gate, and the
// write end of the gate. argv[0] must be an absolute path.
func gatedCommand(argv []string) (*exec.Cmd, *os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	args := append([]string{"-c", gateScript, "kernelgate-gate"}, argv...)
	cmd := exec.Command(gateShell, args...)
	cmd.ExtraFiles = []*os.File{r}
	return cmd, w, nil
}

// openGate lets the gated child become the kernel.
func openGate(w *os.File) error {
	_, err := w.Write([]byte("go\n"))
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return err
}

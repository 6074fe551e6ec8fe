package local

import (
	"os"
	"os/exec"
)

// parentPIDEnv: on Windows ipykernel reads JPY_PARENT_PID as a handle
// it inherited (jupyter_client duplicates one), not a pid, so it is not
// set: a kernel outlives a gateway that is killed.
const parentPIDEnv = false

// gatedCommand returns a command that starts argv at once: there is no
// /bin/sh to wait at a gate, and nothing to apply before the kernel's
// first instruction (no cgroups, no rlimits). The gate is the null
// device, so openGate succeeds. argv[0] must be an absolute path.
func gatedCommand(argv []string) (*exec.Cmd, *os.File, error) {
	w, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return nil, nil, err
	}
	return exec.Command(argv[0], argv[1:]...), w, nil
}

// openGate does nothing but close the gate: the kernel runs already.
func openGate(w *os.File) error { return w.Close() }

package local

import (
	"fmt"
	"os/exec"

	"kernelgate/kernelspecs"
)

// CheckArgv reports whether the program of a kernelspec can be found and
// run, without starting it.
func CheckArgv(s *kernelspecs.Spec) error {
	if len(s.Argv) == 0 {
		return fmt.Errorf("kernelspec %s has no argv", s.Name)
	}
	if _, err := exec.LookPath(s.Argv[0]); err != nil {
		return fmt.Errorf("kernelspec %s: %v", s.Name, err)
	}
	return nil
}

//go:build !linux

package jupyter

import "errors"

// processStart is unknown without /proc: no local kernel is adopted.
func processStart(pid int) (uint64, error) {
	return 0, errors.New("process start time unknown on this system")
}

func bootID() string { return "" }

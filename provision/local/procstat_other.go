//go:build !linux

package local

import "errors"

// LocalAdoption says whether a later gateway can adopt this one's local
// kernels: not without /proc's start times.
const LocalAdoption = false

// processStart is unknown without /proc: no local kernel is adopted.
func processStart(pid int) (uint64, error) {
	return 0, errors.New("process start time unknown on this system")
}

// procStat is unknown without /proc.
func procStat(pid int) (pgrp int, start uint64, err error) {
	return 0, 0, errors.New("process status unknown on this system")
}

func bootID() string { return "" }

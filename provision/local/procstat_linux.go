package local

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// LocalAdoption says whether a later gateway can adopt this one's local
// kernels (Provisioner.Adopt), which takes /proc's start times and
// pidfds.
const LocalAdoption = true

// processStart returns field 22 of /proc/<pid>/stat: when the process
// started, in clock ticks since boot.
func processStart(pid int) (uint64, error) {
	_, start, err := procStat(pid)
	return start, err
}

// procStat reads the process group (field 5) and start time (field 22) of
// a live process from /proc/<pid>/stat; a zombie is an error.
func procStat(pid int) (pgrp int, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command (field 2) is in parentheses and may hold anything;
	// the fields after its last ')' start with field 3.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, 0, fmt.Errorf("process %d has ended", pid)
	}
	if pgrp, err = strconv.Atoi(f[2]); err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: process group: %w", pid, err)
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return pgrp, start, err
}

// bootID names this boot of the machine.
func bootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
}

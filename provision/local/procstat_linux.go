package local

import (
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/prometheus/procfs"
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

// procFS is /proc, opened once: procfs.NewFS checks the mount each time.
var procFS = sync.OnceValues(procfs.NewDefaultFS)

// procStat reads the process group and start time of a live process
// from /proc/<pid>/stat; a zombie is an error.
func procStat(pid int) (pgrp int, start uint64, err error) {
	fs, err := procFS()
	if err != nil {
		return 0, 0, err
	}
	p, err := fs.Proc(pid)
	if err != nil {
		return 0, 0, err
	}
	st, err := p.Stat()
	if err != nil {
		return 0, 0, err
	}
	if st.State == "Z" || st.State == "X" {
		return 0, 0, fmt.Errorf("process %d has ended", pid)
	}
	return st.PGRP, st.Starttime, nil
}

// bootID names this boot of the machine.
func bootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
}

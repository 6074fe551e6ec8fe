package k8stest

import (
	"os"

	"github.com/prometheus/procfs"
)

var pageSize = int64(os.Getpagesize())

// groupRSS sums the resident memory of the processes in process group
// pgid, from /proc/<pid>/stat.
func groupRSS(pgid int) int64 {
	procs, err := procfs.AllProcs()
	if err != nil {
		return 0
	}
	var total int64
	for _, p := range procs {
		st, err := p.Stat()
		if err != nil || st.PGRP != pgid {
			continue
		}
		total += int64(st.RSS) * pageSize
	}
	return total
}

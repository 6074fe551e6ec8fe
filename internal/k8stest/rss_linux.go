package k8stest

import (
	"os"
	"strconv"
	"strings"
)

var pageSize = int64(os.Getpagesize())

// groupRSS sums the resident memory of the processes in process group
// pgid, from /proc/<pid>/stat.
func groupRSS(pgid int) int64 {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	want := strconv.Itoa(pgid)
	var total int64
	for _, p := range procs {
		if p.Name()[0] < '0' || p.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + p.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		// After the command: state ppid pgrp … rss is the 22nd.
		if len(fields) < 22 || fields[2] != want {
			continue
		}
		pages, _ := strconv.ParseInt(fields[21], 10, 64)
		total += pages * pageSize
	}
	return total
}

package jupyter

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

type resources struct {
	goroutines, fds, children int
}

// snapshot counts goroutines, open files and child processes.
func snapshot(t *testing.T) resources {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return resources{goroutines: runtime.NumGoroutine(), fds: len(fds), children: len(children())}
}

// children lists the pids whose parent is this process (zombies included).
func children() []int {
	self := os.Getpid()
	var out []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + p.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(self) {
			out = append(out, pid)
		}
	}
	return out
}

// checkNoLeaks waits (with a deadline) for the counts to come back to before.
func checkNoLeaks(t *testing.T, before resources) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var now resources
poll:
	for {
		now = snapshot(t)
		if now.goroutines <= before.goroutines && now.fds <= before.fds && now.children <= before.children {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			break poll
		}
	}
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	t.Errorf("leak: before %+v, after %+v (children %v)\n%s", before, now, children(), buf)
}

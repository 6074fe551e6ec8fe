// Package leakcheck lets tests check that goroutines, open files and child
// processes come back to what they were.
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/procfs"
)

// Resources are counts that leaks make grow.
type Resources struct {
	Goroutines, FDs, Children int
}

// Snapshot counts this process's goroutines, open files and children.
func Snapshot(t testing.TB) Resources {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return Resources{Goroutines: runtime.NumGoroutine(), FDs: len(fds), Children: len(Children())}
}

// ZygoteMarker is the argument that marks a zygote of Python kernels
// (provision/local/zygote.go): it lives as long as the process that started it,
// like a cache, and is not counted as a child.
const ZygoteMarker = "kernelgate-zygote"

// Children lists the pids whose parent is this process (zombies included),
// zygotes excepted.
func Children() []int {
	self := os.Getpid()
	var out []int
	procs, _ := procfs.AllProcs()
	for _, p := range procs {
		st, err := p.Stat()
		if err == nil && st.PPID == self && !isZygote(strconv.Itoa(p.PID)) {
			out = append(out, p.PID)
		}
	}
	return out
}

// Check waits (up to a deadline) for the counts to come back to before,
// and fails the test with every goroutine's stack if they do not.
func Check(t testing.TB, before Resources) {
	t.Helper()
	deadline := time.NewTimer(15 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var now Resources
	for {
		now = Snapshot(t)
		if now.Goroutines <= before.Goroutines && now.FDs <= before.FDs && now.Children <= before.Children {
			return
		}
		select {
		case <-tick.C:
			continue
		case <-deadline.C:
		}
		break
	}
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var kids []string
	for _, pid := range Children() {
		var st procfs.ProcStat
		if p, err := procfs.NewProc(pid); err == nil {
			st, _ = p.Stat()
		}
		cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		kids = append(kids, fmt.Sprintf("%d (%s) %s %.120q", pid, st.Comm, st.State, cmd))
	}
	t.Errorf("leak: before %+v, after %+v (children %v)\n%s", before, now, kids, buf)
}

// isZygote says whether process pid is a zygote (a zombie is not).
func isZygote(pid string) bool {
	b, _ := os.ReadFile("/proc/" + pid + "/cmdline")
	for _, arg := range strings.Split(string(b), "\x00") {
		if arg == ZygoteMarker {
			return true
		}
	}
	return false
}

// KernelgateCgroups lists the cgroup directories kernelgate made that hold
// process pid, in either cgroup hierarchy (none where cgroups are
// unavailable): what must be gone once its kernel is.
func KernelgateCgroups(t testing.TB, pid int) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.Contains(parts[2], "/kernelgate/") {
			continue
		}
		candidates := []string{"/sys/fs/cgroup" + parts[2], "/sys/fs/cgroup/unified" + parts[2]}
		if parts[1] != "" {
			candidates = []string{"/sys/fs/cgroup/" + strings.Split(parts[1], ",")[0] + parts[2], "/sys/fs/cgroup/" + parts[1] + parts[2]}
		}
		for _, c := range candidates {
			if fi, err := os.Stat(c); err == nil && fi.IsDir() {
				out = append(out, c)
				break
			}
		}
	}
	if len(out) == 0 {
		t.Logf("process %d is in no cgroup of kernelgate: cgroups unavailable here", pid)
	}
	return out
}

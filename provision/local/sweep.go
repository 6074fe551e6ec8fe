package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"kernelgate/internal/sysproc"
)

// A gateway that dies without shutting its kernels down (SIGKILL, a
// crash, the OOM killer) leaves behind what they were: the processes the
// kernels' code started (a kernel dies with the gateway, its children do
// not), the kernels' directories with their connection files and keys,
// and their cgroups. Everything the local provisioner makes is therefore
// marked with the gateway process that made it (pid, start time, boot),
// and Sweep, run when a gateway starts, removes what was made by gateway
// processes that no longer run. It never touches what a live gateway
// made (or one in another pid namespace, where its pid says nothing), a
// kernel it is told to keep (one a state store still records), a
// detached kernel whose lease runs or whose watchdog lives (orphan.go),
// nor anything without a mark.

// ownerFileName, in a kernel's directory, names the gateway process that
// made it and the kernel's own process.
const ownerFileName = "owner"

// ownerRecord is the content of a kernel directory's owner file.
type ownerRecord struct {
	Gateway  gatewayID `json:"gateway"`
	KernelID string    `json:"kernel_id"`
	// The kernel's process (its group leader) and cgroup directories,
	// once it has started.
	PID      int      `json:"pid,omitempty"`
	PIDStart uint64   `json:"pid_start,omitempty"`
	Cgroups  []string `json:"cgroups,omitempty"`
	// State is the Provisioner.StateID the kernel was launched for.
	State string `json:"state,omitempty"`
}

// gatewayID names one gateway process for as long as the machine runs.
type gatewayID struct {
	PID    int    `json:"pid"`
	Start  uint64 `json:"start"`
	BootID string `json:"boot_id"`
	// PidNS is the inode of its pid namespace: a pid means something
	// only in the namespace it was read in (gateways in containers of
	// their own may share a cgroup hierarchy or a directory).
	PidNS uint64 `json:"pid_ns"`
}

// pidNamespace is the inode of this process's pid namespace, or 0.
func pidNamespace() uint64 {
	link, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return 0
	}
	ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "pid:["), "]"), 10, 64)
	if err != nil {
		return 0
	}
	return ino
}

// thisGateway is the identity of this process; ok is false where it
// cannot be known (no /proc), and then nothing is marked or swept.
var thisGateway = sync.OnceValues(func() (gatewayID, bool) {
	pid := os.Getpid()
	start, err := processStart(pid)
	if err != nil {
		return gatewayID{}, false
	}
	ns := pidNamespace()
	if ns == 0 {
		return gatewayID{}, false
	}
	return gatewayID{PID: pid, Start: start, BootID: bootID(), PidNS: ns}, true
})

// mayRun reports whether the gateway process g may still run: it does,
// or it ran in another pid namespace, where this process cannot tell.
func (g gatewayID) mayRun() bool {
	if g.BootID != "" && g.BootID != bootID() {
		return false
	}
	if self, _ := thisGateway(); g.PidNS != self.PidNS {
		return true
	}
	start, err := processStart(g.PID)
	return err == nil && start == g.Start
}

// tag is how g is written into a cgroup's name.
func (g gatewayID) tag() string {
	return "g" + strconv.Itoa(g.PID) + "-" + strconv.FormatUint(g.Start, 10) + "-" + strconv.FormatUint(g.PidNS, 10)
}

// cgroupOwner reads the gateway tag at the end of a kernel cgroup's name
// (cgroupName); ok is false for a name without one.
func cgroupOwner(name string) (g gatewayID, ok bool) {
	i := strings.LastIndexByte(name, '.')
	if i < 0 || !strings.HasPrefix(name[i+1:], "g") {
		return g, false
	}
	f := strings.Split(name[i+2:], "-")
	if len(f) != 3 {
		return g, false
	}
	var err1, err2, err3 error
	g.PID, err1 = strconv.Atoi(f[0])
	g.Start, err2 = strconv.ParseUint(f[1], 10, 64)
	g.PidNS, err3 = strconv.ParseUint(f[2], 10, 64)
	return g, err1 == nil && err2 == nil && err3 == nil && g.PID > 0
}

// cgroupKernel is the (cleaned) kernel id in a kernel cgroup's name.
func cgroupKernel(name string) string {
	name = strings.TrimPrefix(name, "k-")
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		name = name[:i]
	}
	if i := strings.LastIndexByte(name, '-'); i >= 0 {
		name = name[:i]
	}
	return name
}

// writeOwner records in dir that this gateway made it for kernel id, with
// the kernel's process and cgroups once known.
func writeOwner(dir, id string, pid int, cg *kernelCgroup, stateID string) error {
	g, ok := thisGateway()
	if !ok {
		return nil
	}
	rec := ownerRecord{Gateway: g, KernelID: id, PID: pid, State: stateID}
	if pid > 0 {
		rec.PIDStart, _ = processStart(pid)
	}
	if cg != nil {
		for _, l := range cg.snapshot() {
			rec.Cgroups = append(rec.Cgroups, l.dir)
		}
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, ownerFileName+".new")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, ownerFileName))
}

func readOwner(dir string) (ownerRecord, error) {
	var rec ownerRecord
	b, err := os.ReadFile(filepath.Join(dir, ownerFileName))
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, err
	}
	if rec.Gateway.PID <= 0 {
		return rec, fmt.Errorf("%s: no gateway pid", filepath.Join(dir, ownerFileName))
	}
	return rec, nil
}

// Swept is what Sweep removed.
type Swept struct {
	Dirs      int // kernel directories (connection files, keys, homes)
	Cgroups   int
	Processes int // processes killed
}

// legacyCgroupAge is how old an unmarked, empty kernel cgroup (made by a
// kernelgate from before the marks) must be before Sweep removes it: a
// cgroup is empty for a moment between its creation and its kernel's
// start.
const legacyCgroupAge = time.Minute

// Sweep removes what gateway processes that no longer run left in the
// runtime directory and the kernel cgroups: it kills the processes still
// in their kernels' cgroups or process groups, and removes the kernels'
// directories and cgroups. Kernels whose id is in keep, detached kernels
// whose lease has not run out or whose watchdog runs, and everything a
// running gateway made are left alone. A gateway calls it once as it
// starts, before it launches kernels, and after it adopted again what its
// state store records (keep): a detached kernel launched for the same
// store (StateID) but not kept is then one its gateway died before
// recording, which no gateway will adopt, and it goes despite its lease.
func (p *Provisioner) Sweep(keep []string) (Swept, error) {
	var out Swept
	if _, ok := thisGateway(); !ok {
		return out, nil
	}
	kept := map[string]bool{}
	for _, id := range keep {
		kept[id], kept[cleanID(id)] = true, true
	}
	watched := watchedPaths()
	protected := map[string]bool{} // cgroups of kernels left alone
	var errs []error

	root := p.RuntimeDir
	if root == "" {
		root = DefaultRuntimeDir()
	}
	entries, err := os.ReadDir(root)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "kernel-") {
			continue
		}
		dir := filepath.Join(root, e.Name())
		rec, err := readOwner(dir)
		if err != nil {
			continue // unmarked: not known to be left
		}
		unrecorded := p.StateID != "" && rec.State == p.StateID
		if rec.Gateway.mayRun() || kept[rec.KernelID] || !unrecorded && (watched[dir] || leaseRuns(dir)) {
			for _, c := range rec.Cgroups {
				protected[c] = true
			}
			continue
		}
		out.Processes += killGroup(rec.PID, rec.PIDStart)
		for _, c := range rec.Cgroups {
			if !exists(c) {
				continue
			}
			n, err := removeLeftCgroup(c)
			out.Processes += n
			if err != nil {
				errs = append(errs, err)
			} else {
				out.Cgroups++
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		} else {
			out.Dirs++
		}
	}

	host, err := hostCgroups()
	if err != nil {
		return out, errors.Join(errs...)
	}
	for _, h := range host.hierarchies {
		leaves, err := os.ReadDir(h.parent)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range leaves {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), "k-") {
				continue
			}
			dir := filepath.Join(h.parent, e.Name())
			g, marked := cgroupOwner(e.Name())
			if !marked {
				// Made by an older kernelgate: removed only when empty
				// (a cgroup with processes cannot be removed) and old.
				if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > legacyCgroupAge && os.Remove(dir) == nil {
					out.Cgroups++
				}
				continue
			}
			if g.mayRun() || kept[cgroupKernel(e.Name())] || protected[dir] || watched[dir] {
				continue
			}
			n, err := removeLeftCgroup(dir)
			out.Processes += n
			if err != nil {
				errs = append(errs, err)
			} else {
				out.Cgroups++
			}
		}
	}
	return out, errors.Join(errs...)
}

// cleanID is a kernel id as cgroupName writes it.
func cleanID(id string) string {
	clean := strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return -1
	}, id)
	if len(clean) > 64 {
		clean = clean[:64]
	}
	return clean
}

// removeLeftCgroup kills the processes in the cgroup directory dir and
// removes it; it returns how many processes it killed.
func removeLeftCgroup(dir string) (int, error) {
	cg := &kernelCgroup{leaves: []cgLeaf{{dir: dir}}}
	n := len(cg.procs())
	cg.kill()
	return n, cg.remove()
}

// leaseRuns reports whether the kernel directory dir holds a lease that
// has not run out (a detached kernel waiting for a gateway, orphan.go).
func leaseRuns(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, leaseFileName))
	if err != nil {
		return false
	}
	until, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return err == nil && time.Now().Unix() <= until
}

// killGroup kills the process group of a kernel that no longer has a
// gateway: pid led it, started at start. When pid is another process now
// the group has ended; when pid is gone but members of its group remain,
// the group is still the kernel's (Linux does not reuse a pid while it
// names a process group).
func killGroup(pid int, start uint64) int {
	if pid <= 0 || start == 0 {
		return 0
	}
	if s, err := processStart(pid); err == nil {
		if s != start {
			return 0
		}
		members := groupMembers(pid, start)
		sysproc.Kill(-pid, syscall.SIGKILL)
		return len(members)
	}
	members := groupMembers(pid, start)
	for _, m := range members {
		sysproc.Kill(m, syscall.SIGKILL)
	}
	return len(members)
}

// groupMembers lists the live processes of process group pgid started
// no earlier than start.
func groupMembers(pgid int, start uint64) []int {
	procs, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if g, s, err := procStat(pid); err == nil && g == pgid && s >= start {
			out = append(out, pid)
		}
	}
	return out
}

// watchdogName is the $0 of every kernel watchdog (orphan.go).
const watchdogName = "kernelgate-watchdog"

// watchedPaths lists the kernel directories and cgroups that a running
// watchdog answers for: its kernel is detached and still in the hands of
// its lease.
func watchedPaths() map[string]bool {
	out := map[string]bool{}
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !strings.Contains(string(b), watchdogName) {
			continue
		}
		dir, cgroups, ok := parseWatchdogArgs(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"))
		if !ok {
			continue
		}
		out[dir] = true
		for _, c := range cgroups {
			out[c] = true
		}
	}
	return out
}

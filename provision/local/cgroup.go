package local

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"kernelgate/internal/sysproc"
)

// Each kernel with a memory or process limit gets a cgroup of its own,
// made below a "kernelgate" directory in the gateway's own cgroup or, when
// that is not writable, at the root of the hierarchy. Existing cgroups are
// never changed, except that cgroup v2 needs the memory and pids
// controllers enabled in the parent's cgroup.subtree_control.

const (
	cgroupSuperMagic  = 0x27e0eb
	cgroup2SuperMagic = 0x63677270
	// cgroupParent is the directory that holds the kernels' cgroups.
	cgroupParent = "kernelgate"
	// cgroupDrain bounds how long removing a cgroup waits for its
	// processes to die.
	cgroupDrain = 5 * time.Second
)

// cgroupControllers are those kernelgate limits.
var cgroupControllers = []string{"memory", "pids"}

// cgHierarchy is one mounted hierarchy kernel cgroups are made in.
type cgHierarchy struct {
	v2          bool
	parent      string   // …/kernelgate
	controllers []string // of cgroupControllers, those it carries
}

func (h cgHierarchy) has(c string) bool {
	for _, x := range h.controllers {
		if x == c {
			return true
		}
	}
	return false
}

// cgroupHost is what the machine offers for kernel cgroups.
type cgroupHost struct {
	hierarchies []cgHierarchy
	missing     []string // controllers no writable hierarchy carries
}

// mount is one line of /proc/self/mountinfo.
type mount struct {
	root, point, fstype string
	superOpts           []string
}

func readMounts() ([]mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, x := range fields {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || len(fields) < sep+4 {
			continue
		}
		out = append(out, mount{
			root: unescapeMount(fields[3]), point: unescapeMount(fields[4]),
			fstype: fields[sep+1], superOpts: strings.Split(fields[sep+3], ","),
		})
	}
	return out, sc.Err()
}

// unescapeMount undoes the octal escapes (\040 for a space) of mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ownCgroups reads /proc/self/cgroup: controller → path; "" is the v2
// unified hierarchy.
func ownCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out, nil
}

// candidates are the directories kernel cgroups may go below, best first:
// the gateway's own cgroup, then the root of the hierarchy.
func candidates(m mount, own string, ok bool) []string {
	var out []string
	if ok {
		if rel, err := filepath.Rel(m.root, own); err == nil && !strings.HasPrefix(rel, "..") && rel != "." {
			out = append(out, filepath.Join(m.point, rel))
		}
	}
	return append(out, m.point)
}

// detectCgroups finds, for memory and pids, a hierarchy in which the
// gateway can make cgroups, preferring cgroup v1 controllers where they
// are mounted (as on hybrid systems) and cgroup v2 otherwise.
func detectCgroups() (*cgroupHost, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("%w: cgroups are Linux's", errNoCgroups)
	}
	mounts, err := readMounts()
	if err != nil {
		return nil, err
	}
	own, err := ownCgroups()
	if err != nil {
		return nil, err
	}
	host := &cgroupHost{}
	found := map[string]bool{}
	var errs []error
	for _, c := range cgroupControllers {
		for _, m := range mounts {
			if m.fstype != "cgroup" || !contains(m.superOpts, c) || !isCgroupFS(m.point, cgroupSuperMagic) {
				continue
			}
			path, ok := own[c]
			for _, dir := range candidates(m, path, ok) {
				parent := filepath.Join(dir, cgroupParent)
				if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
					errs = append(errs, err)
					continue
				}
				if !isCgroupFS(parent, cgroupSuperMagic) || !exists(filepath.Join(parent, "cgroup.procs")) {
					continue
				}
				if !writable(parent) {
					// Made by another user (a gateway that ran as
					// root): no kernel cgroup can be made in it.
					errs = append(errs, fmt.Errorf("%s: not writable by uid %d", parent, os.Geteuid()))
					continue
				}
				host.addV1(parent, c)
				found[c] = true
				break
			}
			break
		}
	}
	var want []string
	for _, c := range cgroupControllers {
		if !found[c] {
			want = append(want, c)
		}
	}
	if len(want) > 0 {
		for _, m := range mounts {
			if m.fstype != "cgroup2" || !isCgroupFS(m.point, cgroup2SuperMagic) {
				continue
			}
			avail, _ := os.ReadFile(filepath.Join(m.point, "cgroup.controllers"))
			var ctrls []string
			for _, c := range want {
				if contains(strings.Fields(string(avail)), c) {
					ctrls = append(ctrls, c)
				}
			}
			if len(ctrls) == 0 {
				continue
			}
			path, ok := own[""]
			for _, dir := range candidates(m, path, ok) {
				parent, err := v2Parent(dir, ctrls)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				host.hierarchies = append(host.hierarchies, cgHierarchy{v2: true, parent: parent, controllers: ctrls})
				for _, c := range ctrls {
					found[c] = true
				}
				break
			}
			break
		}
	}
	for _, c := range cgroupControllers {
		if !found[c] {
			host.missing = append(host.missing, c)
		}
	}
	if len(host.hierarchies) == 0 {
		return nil, fmt.Errorf("%w: %v", errNoCgroups, errors.Join(errs...))
	}
	return host, nil
}

// addV1 records that controller c is usable below parent, which may be
// shared with another controller mounted in the same hierarchy.
func (h *cgroupHost) addV1(parent, c string) {
	for i := range h.hierarchies {
		if h.hierarchies[i].parent == parent {
			h.hierarchies[i].controllers = append(h.hierarchies[i].controllers, c)
			return
		}
	}
	h.hierarchies = append(h.hierarchies, cgHierarchy{parent: parent, controllers: []string{c}})
}

// v2Parent makes dir/kernelgate with ctrls enabled for its children. The
// kernel cgroups below it are leaves, so the "no internal processes" rule
// holds; dir itself must have no processes unless it is the root.
func v2Parent(dir string, ctrls []string) (string, error) {
	enable := "+" + strings.Join(ctrls, " +")
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(enable), 0); err != nil {
		return "", err
	}
	parent := filepath.Join(dir, cgroupParent)
	if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte(enable), 0); err != nil {
		return "", err
	}
	return parent, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// kernelCgroup is the cgroup (one directory per hierarchy) of one kernel.
type kernelCgroup struct {
	mu     sync.Mutex
	leaves []cgLeaf // nil once removed
}

// snapshot returns the leaves that still exist.
func (cg *kernelCgroup) snapshot() []cgLeaf {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	return cg.leaves
}

type cgLeaf struct {
	cgHierarchy
	dir string
}

// create makes the cgroup name with the limits of l in every hierarchy
// that carries one of them, and always in the pids hierarchy: it holds
// every process of the kernel, so those that left its process group
// (a daemon, a setsid child) are still killed with it.
func (h *cgroupHost) create(name string, l Limits) (*kernelCgroup, error) {
	cg := &kernelCgroup{}
	for _, hi := range h.hierarchies {
		mem := hi.has("memory") && l.MemoryBytes > 0
		pids := hi.has("pids")
		if !mem && !pids {
			continue
		}
		leaf := cgLeaf{cgHierarchy: hi, dir: filepath.Join(hi.parent, name)}
		if err := os.Mkdir(leaf.dir, 0o755); err != nil {
			cg.remove()
			return nil, err
		}
		cg.leaves = append(cg.leaves, leaf)
		if err := leaf.setLimits(mem, pids, l); err != nil {
			cg.remove()
			return nil, err
		}
	}
	return cg, nil
}

func (c cgLeaf) write(file, value string) error {
	return os.WriteFile(filepath.Join(c.dir, file), []byte(value), 0)
}

func (c cgLeaf) setLimits(mem, pids bool, l Limits) error {
	if mem {
		n := strconv.FormatInt(l.MemoryBytes, 10)
		if c.v2 {
			if err := c.write("memory.max", n); err != nil {
				return err
			}
			c.write("memory.swap.max", "0") // absent without swap accounting
		} else {
			if err := c.write("memory.limit_in_bytes", n); err != nil {
				return err
			}
			c.write("memory.memsw.limit_in_bytes", n) // absent without swap accounting
		}
	}
	if pids && l.Pids > 0 {
		if err := c.write("pids.max", strconv.Itoa(l.Pids)); err != nil {
			return err
		}
	}
	return nil
}

// join moves process pid (with all its threads) into the cgroup.
func (cg *kernelCgroup) join(pid int) error {
	for _, leaf := range cg.snapshot() {
		if err := leaf.write("cgroup.procs", strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// oomKills is how many processes of the cgroup the OOM killer killed.
func (cg *kernelCgroup) oomKills() int {
	for _, leaf := range cg.snapshot() {
		if !leaf.has("memory") {
			continue
		}
		file := "memory.oom_control"
		if leaf.v2 {
			file = "memory.events"
		}
		return statValue(filepath.Join(leaf.dir, file), "oom_kill")
	}
	return 0
}

// statValue reads the number after key in a flat-keyed cgroup file.
func statValue(path, key string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// procs lists the processes in the cgroup.
func (cg *kernelCgroup) procs() []int {
	var out []int
	for _, leaf := range cg.snapshot() {
		b, err := os.ReadFile(filepath.Join(leaf.dir, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}

// kill sends SIGKILL to every process in the cgroup, also those that left
// the kernel's process group.
func (cg *kernelCgroup) kill() {
	if cg == nil {
		return
	}
	for _, leaf := range cg.snapshot() {
		if leaf.v2 {
			leaf.write("cgroup.kill", "1") // Linux 5.14+
		}
	}
	for _, pid := range cg.procs() {
		sysproc.Kill(pid, syscall.SIGKILL)
	}
}

// remove kills what is left in the cgroup and removes its directories,
// waiting up to cgroupDrain for the processes to go.
func (cg *kernelCgroup) remove() error {
	if cg == nil {
		return nil
	}
	deadline := time.Now().Add(cgroupDrain)
	// cgroup v1 tells nobody when a cgroup empties: poll until it does.
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	var errs []error
	for _, leaf := range cg.snapshot() {
		for {
			err := os.Remove(leaf.dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				errs = append(errs, err)
				break
			}
			cg.kill()
			<-poll.C
		}
	}
	cg.mu.Lock()
	cg.leaves = nil
	cg.mu.Unlock()
	return errors.Join(errs...)
}

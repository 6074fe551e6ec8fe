//go:build linux

package local

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"kernelgate/internal/needs"
)

// leftKernel is what a kernel of some gateway process left: its
// directory, its cgroup and a process in it.
type leftKernel struct {
	dir  string
	cg   *kernelCgroup
	proc *exec.Cmd
	done chan struct{}
}

// leave makes the remains of kernel id, owned by gateway g, below root:
// with dir, a kernel directory whose owner record names g and id; with
// lease, a lease running for another minute.
func leave(t *testing.T, host *cgroupHost, root, id string, g gatewayID, dir, lease bool) *leftKernel {
	t.Helper()
	l := &leftKernel{done: make(chan struct{})}
	l.proc = exec.Command("sleep", "300")
	l.proc.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := l.proc.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		l.proc.Wait()
		close(l.done)
	}()
	t.Cleanup(func() {
		l.proc.Process.Kill()
		<-l.done
		l.cg.remove()
	})
	var err error
	if l.cg, err = host.createUnlimited("k-" + id + "-0123abcd." + g.tag()); err != nil {
		t.Fatal(err)
	}
	if err := l.cg.join(l.proc.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if !dir {
		return l
	}
	l.dir = filepath.Join(root, "kernel-"+id)
	if err := os.MkdirAll(filepath.Join(l.dir, "kernel"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(l.dir, "kernel", "kernel-"+id+".json"), []byte(`{"key": "k"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	start, _ := processStart(l.proc.Process.Pid)
	rec := ownerRecordFor(g, id, l.proc.Process.Pid, start, l.cg)
	if err := os.WriteFile(filepath.Join(l.dir, ownerFileName), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	if lease {
		until := strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)
		if err := os.WriteFile(filepath.Join(l.dir, leaseFileName), []byte(until+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

func ownerRecordFor(g gatewayID, id string, pid int, start uint64, cg *kernelCgroup) []byte {
	rec := ownerRecord{Gateway: g, KernelID: id, PID: pid, PIDStart: start}
	for _, l := range cg.snapshot() {
		rec.Cgroups = append(rec.Cgroups, l.dir)
	}
	b, _ := json.Marshal(rec)
	return b
}

// gone reports whether l was swept: its process ended, its cgroup and
// directory removed.
func (l *leftKernel) gone(t *testing.T) bool {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(10 * time.Second):
		return false
	}
	for _, leaf := range l.cg.snapshot() {
		if exists(leaf.dir) {
			return false
		}
	}
	return l.dir == "" || !exists(l.dir)
}

// untouched reports whether l is as it was left.
func (l *leftKernel) untouched() bool {
	select {
	case <-l.done:
		return false
	default:
	}
	for _, leaf := range l.cg.snapshot() {
		if !exists(leaf.dir) {
			return false
		}
	}
	return l.dir == "" || exists(filepath.Join(l.dir, "kernel"))
}

// markState records in l's owner record that it was launched for the
// state store stateID.
func markState(t *testing.T, l *leftKernel, stateID string) {
	t.Helper()
	rec, err := readOwner(l.dir)
	if err != nil {
		t.Fatal(err)
	}
	rec.State = stateID
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(filepath.Join(l.dir, ownerFileName), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// The sweep at start removes what dead gateway processes left (processes,
// directories, cgroups, also a cgroup without a directory), and leaves
// alone the kernels it must keep, those of a live gateway, a detached
// kernel whose lease runs, and a directory without an owner record. A
// leased kernel launched for this gateway's state store that the store
// does not keep (its gateway died before recording it) is removed; one of
// another store is not.
func TestSweepKeepsKeptAndLiveOwners(t *testing.T) {
	host, err := hostCgroups()
	if err != nil {
		needs.Skip(t, "no writable cgroups: %v", err)
	}
	self, ok := thisGateway()
	if !ok {
		needs.Skip(t, "no /proc: gateway processes cannot be told apart")
	}
	// A gateway process that has ended.
	gone := exec.Command("sleep", "300")
	if err := gone.Start(); err != nil {
		t.Fatal(err)
	}
	start, err := processStart(gone.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	gone.Process.Kill()
	gone.Wait()
	dead := gatewayID{PID: gone.Process.Pid, Start: start, BootID: bootID(), PidNS: self.PidNS}
	// The same dead gateway seen from another pid namespace.
	elsewhere := dead
	elsewhere.PidNS++

	root := t.TempDir()
	left := leave(t, host, root, "left-1111", dead, true, false)
	cgroupOnly := leave(t, host, root, "left-2222", dead, false, false)
	kept := leave(t, host, root, "kept-3333", dead, true, false)
	live := leave(t, host, root, "live-4444", self, true, false)
	leased := leave(t, host, root, "lease-5555", dead, true, true)
	foreign := leave(t, host, root, "ns-6666", elsewhere, true, false)
	unrecorded := leave(t, host, root, "ours-7777", dead, true, true)
	otherStore := leave(t, host, root, "other-8888", dead, true, true)
	recorded := leave(t, host, root, "ours-9999", dead, true, true)
	markState(t, unrecorded, "/var/lib/kg-a")
	markState(t, otherStore, "/var/lib/kg-b")
	markState(t, recorded, "/var/lib/kg-a")
	unmarked := filepath.Join(root, "kernel-unmarked")
	if err := os.MkdirAll(filepath.Join(unmarked, "kernel"), 0o700); err != nil {
		t.Fatal(err)
	}

	swept, err := (&Provisioner{RuntimeDir: root, StateID: "/var/lib/kg-a"}).Sweep([]string{"kept-3333", "ours-9999"})
	if err != nil {
		t.Errorf("Sweep: %v", err)
	}
	if !left.gone(t) {
		t.Errorf("the remains of a dead gateway's kernel were not swept")
	}
	if !cgroupOnly.gone(t) {
		t.Errorf("a dead gateway's cgroup without a directory was not swept")
	}
	if !unrecorded.gone(t) {
		t.Errorf("a leased kernel of this store that the store does not keep was not swept")
	}
	for name, l := range map[string]*leftKernel{"a kept kernel": kept, "a live gateway's kernel": live, "a detached kernel with a running lease": leased,
		"a kernel of another pid namespace": foreign, "a leased kernel of another store": otherStore, "a kept leased kernel of this store": recorded} {
		if !l.untouched() {
			t.Errorf("the sweep touched %s", name)
		}
	}
	if !exists(unmarked) {
		t.Errorf("the sweep removed a directory without an owner record")
	}
	if swept.Dirs != 2 || swept.Processes < 3 {
		t.Errorf("Sweep reported %+v; want 2 directories and at least 3 processes", swept)
	}
}

// Where there are no cgroups a left kernel's processes are found by its
// process group: once the kernel (the group's leader) has died, its
// children still in the group are killed.
func TestKillGroupOfAGoneLeader(t *testing.T) {
	leader := exec.Command("sh", "-c", "sleep 300 & echo $!; wait")
	leader.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := leader.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	start, err := processStart(leader.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	var child int
	if _, err := fmt.Fscan(out, &child); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
	leader.Process.Kill()
	leader.Wait()

	if _, err := processStart(child); err != nil {
		t.Fatalf("the child %d died with its leader: nothing to test", child)
	}
	if n := killGroup(leader.Process.Pid, start); n != 1 {
		t.Errorf("killGroup killed %d processes, want the one child", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := processStart(child); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d of the gone leader still runs", child)
		}
		<-time.After(10 * time.Millisecond)
	}
}

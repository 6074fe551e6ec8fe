package state

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// lockHolders lists the processes other than self that hold a lock on
// the file f (from /proc/locks); unknown holders count as others.
func lockHolders(f *os.File, self int) []int {
	fi, err := f.Stat()
	if err != nil {
		return []int{-1}
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return []int{-1}
	}
	// /proc/locks names a file as major:minor:inode, device numbers in hex.
	dev := uint64(st.Dev)
	major := (dev>>8)&0xfff | (dev>>32)&^0xfff
	minor := dev&0xff | (dev>>12)&^0xff
	id := fmt.Sprintf("%02x:%02x:%d", major, minor, st.Ino)
	locks, err := os.Open("/proc/locks")
	if err != nil {
		return []int{-1}
	}
	defer locks.Close()
	var out []int
	sc := bufio.NewScanner(locks)
	for sc.Scan() {
		// 1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] == "->" || fields[5] != id {
			continue
		}
		pid, err := strconv.Atoi(fields[4])
		if err != nil || pid != self {
			out = append(out, pid)
		}
	}
	return out
}

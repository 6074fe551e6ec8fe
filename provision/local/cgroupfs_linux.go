package local

import "syscall"

// isCgroupFS says whether dir is the root of a file system of type magic.
func isCgroupFS(dir string, magic int64) bool {
	var st syscall.Statfs_t
	return syscall.Statfs(dir, &st) == nil && int64(st.Type) == magic
}

// writable says whether this process may make entries in dir.
func writable(dir string) bool {
	const wOK, xOK = 2, 1
	return syscall.Access(dir, wOK|xOK) == nil
}

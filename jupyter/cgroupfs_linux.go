package jupyter

import "syscall"

// isCgroupFS says whether dir is the root of a file system of type magic.
func isCgroupFS(dir string, magic int64) bool {
	var st syscall.Statfs_t
	return syscall.Statfs(dir, &st) == nil && int64(st.Type) == magic
}

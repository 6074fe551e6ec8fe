//go:build !linux

package jupyter

// isCgroupFS: there are no cgroups here (detectCgroups says so first).
func isCgroupFS(string, int64) bool { return false }

//go:build !linux

package local

// isCgroupFS: there are no cgroups here (detectCgroups says so first).
func isCgroupFS(string, int64) bool { return false }

// writable: there are no cgroups here.
func writable(string) bool { return false }

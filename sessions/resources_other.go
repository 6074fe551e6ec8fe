//go:build !linux

package sessions

// machineMemory is the machine's memory in bytes, or 0: unknown here.
func machineMemory() int64 { return 0 }

//go:build !linux

package main

import (
	"fmt"
	"os"
)

// The benchmarks read /proc (memory, CPU, process trees) and compare
// against Linux-only launchers: they run on Linux only.
func main() {
	fmt.Fprintln(os.Stderr, "bench: runs on Linux only")
	os.Exit(2)
}

package kubernetes

import (
	"fmt"
	"os"
	"testing"
)

// TestMain lets the test binary be a kernel pod's launcher: run as
// `TESTBINARY kernel-entry -- ARGV...` it is `kernelgate kernel-entry`.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "kernel-entry" {
		if err := Entry(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

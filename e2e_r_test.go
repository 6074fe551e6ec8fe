//go:build linux

package main

import (
	"os"
	"path/filepath"
	"testing"

	"kernelgate/internal/needs"
)

// TestE2BSDKWithR: the unmodified E2B SDK runs R (runCode with language
// 'r'): values, output, plots, data frames, errors and contexts.
func TestE2BSDKWithR(t *testing.T) {
	if _, err := os.Stat(filepath.Join(kernelsDir(t), "ir", "kernel.json")); err != nil {
		needs.Skip(t, "no ir kernelspec (R with IRkernel): run make kernels (%v)", err)
	}
	bin := buildBinary(t)
	gw := startGateway(t, bin, "--token", "e2b-token-0123456789")
	node(t, "e2b-r.mjs", "KERNELGATE_URL="+gw.url, "KERNELGATE_TOKEN=e2b-token-0123456789")
}

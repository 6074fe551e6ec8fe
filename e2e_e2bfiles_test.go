//go:build linux

package main

import "testing"

// The E2B SDK's multi-file writes keep each file's folders.
func TestE2BSDKFiles(t *testing.T) {
	bin := buildBinary(t)
	gw := startGateway(t, bin, "--token", "e2b-token-0123456789")
	node(t, "e2b-files.mjs", "KERNELGATE_URL="+gw.url, "KERNELGATE_TOKEN=e2b-token-0123456789")
}

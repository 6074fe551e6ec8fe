//go:build linux

package main

import "testing"

// TestE2BCommands: the unmodified E2B SDK's sbx.commands (run with
// callbacks, a failing command, cwd and envs, a background command with
// stdin, list, connect, kill, a timeout) over envd's process service.
func TestE2BCommands(t *testing.T) {
	bin := buildBinary(t)
	gw := startGateway(t, bin, "--token", "e2b-token-0123456789")
	node(t, "e2b-commands.mjs", "KERNELGATE_URL="+gw.url, "KERNELGATE_TOKEN=e2b-token-0123456789")
}

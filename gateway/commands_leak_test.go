//go:build linux

package gateway

import (
	"testing"
	"time"

	"kernelgate/sessions"
)

// TestCommandCyclesLeakNothing starts and stops gateways that run
// commands (one ended, one killed, one with stdin, one left running when
// the gateway stops) and checks that goroutines, open files and processes
// come back to where they were.
func TestCommandCyclesLeakNothing(t *testing.T) {
	checkCyclesLeakNothing(t, sessions.Config{}, 2, func(g *testGateway) func() {
		b4Context(t, g, map[string]any{"id": "c1"})
		g.command("c1", map[string]any{"cmd": "echo out; echo err >&2"})
		killed := g.background("c1", map[string]any{"cmd": "sleep 300 & wait"})
		g.do("POST", "/api/runs/"+killed+"/kill", nil)
		g.waitRun(killed, 30*time.Second)
		in := g.background("c1", map[string]any{"cmd": "read x; echo $x", "stdin": true})
		g.do("POST", "/api/runs/"+in+"/input", map[string]string{"value": "v\n"})
		g.waitRun(in, 30*time.Second)
		g.background("c1", map[string]any{"cmd": "sleep 300"})
		return nil
	})
}

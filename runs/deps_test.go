package runs

import (
	"os/exec"
	"strings"
	"testing"

	"kernelgate/internal/needs"
)

// runs knows kernels only through the interfaces it is handed: it imports
// neither sessions (which imports it), nor the gateway, nor the web or
// ZeroMQ libraries.
func TestImportsStayBelowSessions(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		needs.Skip(t, "no go command to list the imports: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"kernelgate/sessions", "kernelgate/gateway", "kernelgate/mcp", "kernelgate/e2b",
			"github.com/labstack/echo", "github.com/gorilla/websocket", "github.com/go-zeromq/zmq4"} {
			if dep == banned || strings.HasPrefix(dep, banned+"/") {
				t.Errorf("runs imports %s", dep)
			}
		}
	}
}

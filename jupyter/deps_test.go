package jupyter

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"kernelgate/internal/needs"
)

// The package names no provisioner: it imports none, and its code holds
// nothing of the local one (cgroups, bubblewrap, the zygote, rlimits),
// which lives in provision/local.
func TestNamesNoProvisioner(t *testing.T) {
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		needs.Skip(t, "no go tool to list the package's imports: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "kernelgate/provision") {
			t.Errorf("package jupyter imports %s", dep)
		}
	}
	local := regexp.MustCompile(`cgroup|bwrap|zygote|rlimit|Prlimit`)
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if local.MatchString(line) {
				t.Errorf("%s:%d names the local provisioner's own: %s", f, i+1, strings.TrimSpace(line))
			}
		}
	}
}

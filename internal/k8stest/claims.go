package k8stest

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// claimMounts are a container's mounts of the node's claims
// (NodeConfig.Claims). On a node with claims every container runs in a
// mount namespace of its own where each claim's host folder is hidden
// under an empty tmpfs and only the folders it mounts appear,
// bind-mounted at their mountPath: a process of a pod sees of a claim
// what a pod on a real node sees, nothing when it mounts none.
type claimMounts struct {
	binds   []mountedPath // path: the mountPath; host: the claim's folder
	hidden  []string      // the claims' host folders
	workDir string        // the container's workingDir when it is in a bind
}

// hide hides the claim's host folder from the container.
func (c *claimMounts) hide(root string) {
	if !slices.Contains(c.hidden, root) {
		c.hidden = append(c.hidden, root)
	}
}

// at reports whether path is in one of the binds.
func (c claimMounts) at(path string) bool {
	path = filepath.Clean(path)
	for _, b := range c.binds {
		if path == b.path || strings.HasPrefix(path, b.path+"/") {
			return true
		}
	}
	return false
}

// wrap returns argv run by a shell that first sets the mounts up in the
// mount namespace the process starts in (mountNamespace); stage is a
// folder of the pod's, outside every claim, for the binds made before
// the claims are hidden.
func (c claimMounts) wrap(argv []string, stage string) ([]string, error) {
	mount, err := exec.LookPath("mount")
	if err != nil {
		return nil, fmt.Errorf("the test node mounts claims with mount(8): %w", err)
	}
	q := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
	var b strings.Builder
	b.WriteString("set -e\n")
	for i, m := range c.binds {
		st := filepath.Join(stage, strconv.Itoa(i))
		fmt.Fprintf(&b, "mkdir -p %s\n%s --bind %s %s\n", q(st), q(mount), q(m.host), q(st))
	}
	for _, h := range c.hidden {
		fmt.Fprintf(&b, "%s -t tmpfs -o mode=0755 k8stest-hidden %s\n", q(mount), q(h))
	}
	for i, m := range c.binds {
		st := filepath.Join(stage, strconv.Itoa(i))
		fmt.Fprintf(&b, "mkdir -p %s\n%s --bind %s %s\n", q(m.path), q(mount), q(st), q(m.path))
	}
	if c.workDir != "" {
		fmt.Fprintf(&b, "cd %s\n", q(c.workDir))
	}
	b.WriteString(`exec "$@"` + "\n")
	return append([]string{"/bin/sh", "-c", b.String(), "k8stest-mounts"}, argv...), nil
}

package sessions

import (
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"strings"
	"time"
	"unicode"

	"k8s.io/apimachinery/pkg/api/resource"

	"kernelgate/kernelspecs"
	"kernelgate/provision/local"
)

// MaxRunTimeout bounds a run's timeout (a year: longer is no limit in
// practice, and 0 already says that).
const MaxRunTimeout = 365 * 24 * time.Hour

// TimeoutRange says which run timeouts are accepted, for messages.
const TimeoutRange = "timeout is a number of seconds from 0 (no limit) to 31536000 (365 days)"

// sizeUnits are the units ParseBytes takes: KiB to TiB, and K, M, G, in
// powers of 1024; KB to TB in powers of 1000; B for bytes.
var sizeUnits = []struct {
	unit string
	mult int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1},
}

// sizeNumber is the number before a unit: digits, with a fraction.
var sizeNumber = regexp.MustCompile(`^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)$`)

// maxSize is the largest size, in bytes.
var maxSize = resource.NewQuantity(math.MaxInt64, resource.BinarySI)

// ParseBytes reads a size: a number of bytes, or a number (with a
// fraction) and a unit (KiB, MiB, GiB, TiB, or K, M, G alike; KB, MB,
// GB, TB in powers of 1000; B), rounded up to a whole byte. Units are
// case-sensitive: 512m is refused, not read as 512 MiB (nor as a
// Kubernetes quantity's 0.512). A size past the largest int64 is refused.
func ParseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	num, mult := s, int64(1)
	unit := false
	for _, u := range sizeUnits {
		if n, ok := strings.CutSuffix(s, u.unit); ok {
			num, mult, unit = strings.TrimSpace(n), u.mult, true
			break
		}
	}
	if !sizeNumber.MatchString(num) || !unit && strings.Contains(num, ".") {
		if i := strings.IndexFunc(s, unicode.IsLetter); i > 0 && sizeNumber.MatchString(strings.TrimSpace(s[:i])) {
			return 0, fmt.Errorf("bad size %q: the unit is one of KiB, MiB, GiB, TiB, KB, MB, GB, TB, K, M, G or B (case-sensitive)", s)
		}
		return 0, fmt.Errorf("bad size %q (want bytes or a unit such as 512MiB)", s)
	}
	// The number alone is a decimal quantity, which ParseQuantity never
	// caps (it caps binary ones at the largest int64, silently); the unit
	// multiplies it exactly.
	q, err := resource.ParseQuantity(num)
	if err != nil {
		return 0, fmt.Errorf("bad size %q: %v", s, err)
	}
	q.Mul(mult)
	switch {
	case q.Sign() < 0:
		return 0, fmt.Errorf("bad size %q: a size cannot be negative", s)
	case q.Cmp(*maxSize) > 0:
		return 0, fmt.Errorf("bad size %q: too large (at most %d bytes)", s, int64(math.MaxInt64))
	}
	return q.Value(), nil
}

// isolation returns the limits and sandbox of a kernel of spec: the
// manager's defaults, overridden by the spec's metadata.kernelgate
// ({"memory": "2GiB", "pids": 256, "nofile": 4096, "sandbox": true,
// "network": false}).
func (cat *Catalog) isolation(spec *kernelspecs.Spec) (*local.Limits, *local.SandboxConfig, error) {
	limits := cat.cfg.KernelLimits
	var sandbox *local.SandboxConfig
	if cat.cfg.Sandbox != nil {
		sb := *cat.cfg.Sandbox
		sandbox = &sb
	}
	md, _ := spec.Metadata["kernelgate"].(map[string]any)
	for key, v := range md {
		switch key {
		case "memory":
			switch x := v.(type) {
			case string:
				n, err := ParseBytes(x)
				if err != nil {
					return nil, nil, fmt.Errorf("kernelspec %s: metadata.kernelgate.memory: %w", spec.Name, err)
				}
				limits.MemoryBytes = n
			case float64:
				limits.MemoryBytes = int64(x)
			}
		case "pids":
			if x, ok := v.(float64); ok {
				limits.Pids = int(x)
			}
		case "nofile":
			if x, ok := v.(float64); ok {
				limits.NoFile = uint64(x)
			}
		case "sandbox":
			if on, ok := v.(bool); ok {
				if !on {
					sandbox = nil
				} else if sandbox == nil {
					sandbox = &local.SandboxConfig{}
				}
			}
		case "network":
			if on, ok := v.(bool); ok && sandbox != nil {
				sandbox.Network = on
			}
		}
	}
	if sandbox != nil && cat.wsRoot != nil {
		// Other workspaces stay out of sight: the root is hidden, and the
		// kernel's own workspace bound back into it.
		sandbox.Hide = append(append([]string{}, sandbox.Hide...), cat.wsRoot.Dir())
	}
	return &limits, sandbox, nil
}

// checkCwd refuses a working directory outside the workspace root, and
// any working directory chosen by a caller when the sandbox (which makes
// it writable) has no root to keep it in.
func (cat *Catalog) checkCwd(cwd string) error {
	if cwd == "" {
		return nil
	}
	if !filepath.IsAbs(cwd) {
		return errorf(ErrBadRequest, "cwd must be an absolute path")
	}
	root := cat.cfg.WorkspaceRoot
	if root == "" {
		if cat.cfg.Sandbox != nil {
			return errorf(ErrBadRequest, "cwd is not allowed: the gateway runs kernels sandboxed without a workspace root (--workspace-root)")
		}
		return nil
	}
	real, err := filepath.EvalSymlinks(cwd)
	if err != nil {
		return errorf(ErrBadRequest, "cwd %s does not exist", cwd)
	}
	rootReal, err := filepath.EvalSymlinks(root)
	if err != nil {
		return errorf(ErrBadRequest, "the workspace root is missing")
	}
	if rel, err := filepath.Rel(rootReal, real); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return errorf(ErrBadRequest, "cwd must be inside the workspace root %s", root)
	}
	return nil
}

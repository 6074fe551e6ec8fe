package local

import (
	"context"
	"maps"

	"kernelgate/jupyter"
)

// A kernel adopted after a restart (adopted.go) starts commands as the
// gateway that launched it did: its info keeps the launch's command plan
// (CommandInfo), and its cgroup and end are the adopted process's.

// CommandInfo is what an adopted kernel needs to start commands beside
// it: the plan of its launch (commandPlan) but for its cgroup (Info's
// Cgroups) and its end (learnt by the adopting gateway).
type CommandInfo struct {
	// Env is the kernel's environment as launched, without the variables
	// of its launch request's Env: those come from a client and may be
	// secrets, which are not written here a second time. Their keeper
	// (sessions keeps a context's env) lays them over each command's, as
	// it does before a restart too.
	Env map[string]string `json:"env"`
	// Cwd is the kernel's working directory.
	Cwd string `json:"cwd"`
	// Runtime is the provisioner's runtime directory, which holds the
	// kernel's (RuntimeDir).
	Runtime string `json:"runtime"`
	// Dirs are the kernel's own directories.
	Dirs KernelDirs `json:"dirs"`
	// Limits are the kernel's: a command gets its rlimits.
	Limits Limits `json:"limits"`
	// Sandbox is the kernel's bubblewrap sandbox; nil when it has none.
	Sandbox *SandboxConfig `json:"sandbox,omitempty"`
}

// info is what p keeps in its kernel's info; nil for no plan.
func (p *commandPlan) info() *CommandInfo {
	if p == nil {
		return nil
	}
	return &CommandInfo{Env: maps.Clone(p.kept), Cwd: p.cwd, Runtime: p.runtime, Dirs: p.kd, Limits: p.iso.limits, Sandbox: p.iso.sandbox}
}

// plan is the command plan of an adopted kernel whose cgroup is cg
// (nil: none) and whose end closes done.
func (ci *CommandInfo) plan(cg *kernelCgroup, done <-chan struct{}) (*commandPlan, error) {
	iso := isolation{limits: ci.Limits, sandbox: ci.Sandbox}
	if iso.sandbox != nil {
		u, err := iso.sandbox.user()
		if err != nil {
			return nil, err
		}
		iso.user = u
	}
	env := maps.Clone(ci.Env)
	if env == nil {
		env = map[string]string{}
	}
	p := commandPlan{env: env, kept: ci.Env, cwd: ci.Cwd, iso: iso, runtime: ci.Runtime, kd: ci.Dirs, cg: cg}
	return p.of(done), nil
}

// StartCommand implements jupyter.CommandStarter: it fails with
// jupyter.ErrNoCommands for a kernel whose info has no CommandInfo (one
// kept by an earlier version).
func (ap *adoptedProcess) StartCommand(ctx context.Context, req jupyter.CommandRequest) (jupyter.Command, error) {
	return ap.plan.start(ctx, req)
}

var _ jupyter.CommandStarter = (*adoptedProcess)(nil)

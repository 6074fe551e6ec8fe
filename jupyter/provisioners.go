package jupyter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"kernelgate/kernelspecs"
)

// Capabilities say what a provisioner does for the kernels of a
// kernelspec. They are part of the Provisioner interface so that nothing
// above it has to guess from a type.
type Capabilities struct {
	// SignalInterrupts: SIGINT reaches the kernel (interrupt_mode
	// "signal" works); otherwise interrupts go by interrupt_request on the
	// control channel whatever the kernelspec says.
	SignalInterrupts bool
	// Limits: Limits (memory, pids, open files) are enforced by the
	// provisioner; a provisioner without it enforces its own (a pod's
	// resources).
	Limits bool
	// Sandbox: SandboxConfig (bubblewrap) applies.
	Sandbox bool
	// Reconnect: the provisioner adopts kernels it launched before,
	// perhaps from another gateway process (Adopter).
	Reconnect bool
	// OwnWorkspace: a kernel reaches only the workspace it was started
	// in (a pod mounting that folder alone), so a warm kernel cannot be
	// moved into another context's.
	OwnWorkspace bool
}

// ProvisionerChoice is a kernelspec's metadata.kernel_provisioner.
type ProvisionerChoice struct {
	Name   string          `json:"provisioner_name"`
	Config json.RawMessage `json:"config,omitempty"`
}

// ErrNoProvisioner: a kernelspec names a provisioner the gateway does not
// have.
var ErrNoProvisioner = errors.New("jupyter: no such kernel provisioner")

// ChoiceOf reads spec's metadata.kernel_provisioner; Name is empty when
// the spec names none.
func ChoiceOf(spec *kernelspecs.Spec) (ProvisionerChoice, error) {
	var c ProvisionerChoice
	if spec == nil || spec.Metadata == nil {
		return c, nil
	}
	raw, ok := spec.Metadata["kernel_provisioner"]
	if !ok || raw == nil {
		return c, nil
	}
	b, err := json.Marshal(raw)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil {
		return c, fmt.Errorf("kernelspec %s: metadata.kernel_provisioner: %w", spec.Name, err)
	}
	if c.Name == "" {
		return c, fmt.Errorf("kernelspec %s: metadata.kernel_provisioner names no provisioner_name", spec.Name)
	}
	return c, nil
}

// Registry holds the gateway's provisioners by name and picks the one a
// kernelspec names (metadata.kernel_provisioner), or the default for a
// kernelspec that names none. It is itself a Provisioner and an Adopter
// that hand each call to the chosen one, so the layers above it need not
// know there are several.
type Registry struct {
	mu      sync.RWMutex
	def     string
	provs   map[string]Provisioner
	aliases map[string]string
}

var (
	_ Provisioner     = (*Registry)(nil)
	_ Adopter         = (*Registry)(nil)
	_ StartRetrier    = (*Registry)(nil)
	_ LeftoverRemover = (*Registry)(nil)
)

// NewRegistry returns an empty registry whose default is def, the name
// of the provisioner of kernelspecs that name none.
func NewRegistry(def string) *Registry {
	return &Registry{def: def, provs: map[string]Provisioner{}, aliases: map[string]string{}}
}

// Alias makes the provisioner registered as name answer to alias too in
// the ProvisionerInfo it is handed (the name its kept kernels' info
// gives). Names does not list aliases.
func (r *Registry) Alias(alias, name string) {
	r.mu.Lock()
	r.aliases[alias] = name
	r.mu.Unlock()
}

// Register adds p under name, replacing any before.
func (r *Registry) Register(name string, p Provisioner) {
	r.mu.Lock()
	r.provs[name] = p
	r.mu.Unlock()
}

// Names lists the registered provisioners.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.provs))
	for n := range r.provs {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Get returns the provisioner registered as name.
func (r *Registry) Get(name string) (Provisioner, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	p, ok := r.provs[name]
	return p, ok
}

// NameFor is the name of the provisioner spec's kernels run with.
func (r *Registry) NameFor(spec *kernelspecs.Spec) (string, error) {
	c, err := ChoiceOf(spec)
	if err != nil {
		return "", err
	}
	if c.Name == "" {
		return r.def, nil
	}
	return c.Name, nil
}

// For returns the provisioner spec's kernels run with.
func (r *Registry) For(spec *kernelspecs.Spec) (Provisioner, error) {
	name, err := r.NameFor(spec)
	if err != nil {
		return nil, err
	}
	p, ok := r.Get(name)
	if !ok {
		return nil, fmt.Errorf("%w: kernelspec %s asks for %q; this gateway has %s", ErrNoProvisioner, specName(spec), name, strings.Join(r.Names(), ", "))
	}
	return p, nil
}

func specName(spec *kernelspecs.Spec) string {
	if spec == nil {
		return "(none)"
	}
	return spec.Name
}

// Launch starts the kernel with the provisioner its kernelspec names.
func (r *Registry) Launch(ctx context.Context, req LaunchRequest) (Process, error) {
	p, err := r.For(req.Spec)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStartFailed, err)
	}
	return p.Launch(ctx, req)
}

// Capabilities are those of the provisioner spec names; none when it
// names one the gateway does not have.
func (r *Registry) Capabilities(spec *kernelspecs.Spec) Capabilities {
	p, err := r.For(spec)
	if err != nil {
		return Capabilities{}
	}
	return p.Capabilities(spec)
}

// RetryStart asks the provisioner spec names whether a start that failed
// with err is tried again.
func (r *Registry) RetryStart(spec *kernelspecs.Spec, err error, attempt int) bool {
	p, perr := r.For(spec)
	if perr != nil {
		return false
	}
	sr, ok := p.(StartRetrier)
	return ok && sr.RetryStart(spec, err, attempt)
}

// infoProvisioner is the provisioner info names, by name or alias.
func (r *Registry) infoProvisioner(info ProvisionerInfo) (Provisioner, bool) {
	r.mu.RLock()
	name := info.Provisioner
	if n, ok := r.aliases[name]; ok {
		name = n
	}
	p, ok := r.provs[name]
	r.mu.RUnlock()
	return p, ok
}

// RemoveLeftovers hands info to the provisioner that launched the kernel.
func (r *Registry) RemoveLeftovers(info ProvisionerInfo) bool {
	p, ok := r.infoProvisioner(info)
	if !ok {
		return false
	}
	lr, ok := p.(LeftoverRemover)
	return ok && lr.RemoveLeftovers(info)
}

// Adopt hands info to the provisioner that launched the kernel.
func (r *Registry) Adopt(ctx context.Context, info ProvisionerInfo) (Process, error) {
	p, ok := r.infoProvisioner(info)
	if !ok {
		return nil, fmt.Errorf("%w: provisioner %q is not configured", ErrNotAdoptable, info.Provisioner)
	}
	a, ok := p.(Adopter)
	if !ok || !p.Capabilities(nil).Reconnect {
		return nil, fmt.Errorf("%w: provisioner %q cannot adopt kernels", ErrNotAdoptable, info.Provisioner)
	}
	return a.Adopt(ctx, info)
}

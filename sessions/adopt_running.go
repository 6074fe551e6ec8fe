package sessions

import (
	"context"

	"kernelgate/jupyter"
)

// AdoptRunning makes a kernel of the Jupyter API, under id, of a kernel
// that runs already (one another gateway process started, found where its
// provisioner keeps kernels) and connects to it with its state: what a
// gateway does at start for the kernels of kubernetes-provisioner. A
// kernel that cannot be adopted is left as it is.
func (m *Manager) AdoptRunning(ctx context.Context, id, specName string, env map[string]string, info jupyter.ProvisionerInfo) (*Kernel, error) {
	spec, err := m.catalog.Spec(specName)
	if err != nil {
		return nil, err
	}
	k, err := m.newKernel(id, spec, env, workDir{}, restartNow)
	if err != nil {
		return nil, err
	}
	if err := m.reserve(ctx, k); err != nil {
		return nil, err
	}
	k.life.Lock()
	defer k.life.Unlock()
	ctx, cancel := context.WithTimeout(ctx, m.cfg.StartTimeout)
	defer cancel()
	jk, err := jupyter.Reconnect(ctx, m.prov, info, k.config())
	if err != nil {
		m.forget(k)
		return nil, err
	}
	p := jupyterProcess{jk}
	k.mu.Lock()
	k.jk = p
	k.lateWait, _ = m.catalog.lateOutputWait(spec, jk.Info().Implementation)
	k.gen++
	k.state = jupyter.StateIdle
	k.mu.Unlock()
	m.goroutine(func() { k.watch(p) })
	m.log.Info("kernel adopted", "kernel", id, "spec", spec.Name)
	return k, nil
}

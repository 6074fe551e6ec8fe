package sessions

import "kernelgate/state"

// ContextWriter returns the store's writes of records that belong with
// a context (an E2B sandbox's record, with its default context). Among
// replicas they are made under the fence of the lease of the context's
// kernel: committed only while this replica holds it, refused
// (state.ErrFenced) once another replica took the kernel over, even if
// this one wakes up from a pause and writes late; a context this
// replica does not serve (let go, or another's) writes nothing. A single
// gateway writes as always.
func (m *Manager) ContextWriter(contextID string) state.Writer {
	if m.cfg.Ownership == nil || m.store == nil {
		return m.store
	}
	c, err := m.Context(contextID)
	if err != nil {
		// No term of any kernel has epoch 0: every write is refused.
		return state.Fenced(m.store, state.Fence{Kernel: contextID})
	}
	kernel := c.KernelID()
	if kernel == "" {
		return m.store
	}
	return m.writer(kernel)
}

package sessions

// RevokeContextTokens forgets the context tokens kept of context id, in
// its record too: they do not come back after a restart.
func (m *Manager) RevokeContextTokens(id string) error {
	c, err := m.Context(id)
	if err != nil {
		return err
	}
	m.dropTokens(c)
	return nil
}

// RevokeAllContextTokens forgets the context tokens kept of every
// context, in their records too.
func (m *Manager) RevokeAllContextTokens() {
	for _, c := range m.Contexts() {
		m.dropTokens(c)
	}
}

// dropTokens empties c's tokens and records it when it had any.
func (m *Manager) dropTokens(c *Context) {
	c.mu.Lock()
	had := len(c.tokens) > 0
	c.tokens = nil
	c.mu.Unlock()
	if had {
		m.putContext(c)
	}
}

package sessions

// RevokeTokens forgets the context tokens kept of the context, in its
// record too: they do not come back after a restart.
func (c *Context) RevokeTokens() {
	c.mu.Lock()
	had := len(c.tokens) > 0
	c.tokens = nil
	c.mu.Unlock()
	if had {
		c.m.records.putContext(c)
	}
}

// RevokeAllContextTokens forgets the context tokens kept of every
// context, in their records too.
func (m *Manager) RevokeAllContextTokens() {
	for _, c := range m.Contexts() {
		c.RevokeTokens()
	}
}

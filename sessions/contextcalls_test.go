package sessions

import "context"

// interruptContext interrupts what context id runs, as the gateway does.
func interruptContext(m *Manager, ctx context.Context, id string) error {
	c, err := m.Context(id)
	if err != nil {
		return err
	}
	return c.Interrupt(ctx)
}

// restartContext restarts context id's kernel, as the gateway does.
func restartContext(m *Manager, ctx context.Context, id string) (*Context, error) {
	c, err := m.Context(id)
	if err != nil {
		return nil, err
	}
	return c, c.Restart(ctx)
}

package sessions

import "errors"

// ErrUnconfirmed: this replica could not confirm its lease on the
// kernel in time (the store does not answer): it runs nothing on the
// kernel until the store confirms the lease, or says it is lost.
var ErrUnconfirmed = errors.New("sessions: this replica cannot confirm its lease on the kernel")

// confirmer is what an Ownership may also say (cluster.Replica does):
// whether the kernel's lease was renewed in time. A lease held but not
// confirmed (the database stopped or cut off past the lease) is neither
// lost nor let go: the kernel, its contexts and its runs stay, and its
// writes are queued under the same term, committed only if the store
// still says it holds once it answers (docs/replicas.md, "The database
// restarted"). Meanwhile new runs are refused, so that this replica
// never drives a kernel another replica may have taken over.
type confirmer interface {
	Confirmed(kernel string) bool
}

// acting returns ErrUnconfirmed when this replica may not act for the
// kernel now; nil for a single gateway, a context with no kernel yet,
// or a lease confirmed.
func (m *Manager) acting(kernel string) error {
	c, ok := m.cfg.Ownership.(confirmer)
	if !ok || kernel == "" || !m.holds(kernel) || c.Confirmed(kernel) {
		// A lease not held here (handed over, lost) is not this
		// check's: the run's queue says where it goes.
		return nil
	}
	return errorf(ErrUnconfirmed, "this replica could not renew its lease on kernel %s in time (the database does not answer): nothing runs on it until the database confirms the lease; retry", kernel)
}

// holds says this replica holds the kernel's lease now (false for a
// single gateway).
func (m *Manager) holds(kernel string) bool {
	if m.cfg.Ownership == nil {
		return false
	}
	_, ok := m.cfg.Ownership.Fence(kernel)
	return ok
}

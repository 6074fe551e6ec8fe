package runs

// Divert makes the queue refuse every run enqueued from now on with err
// (its context's kernel is being handed over to another replica, where
// the runs go instead); the runs already queued and the one running are
// left as they are. Divert(nil) takes runs again.
func (q *Queue) Divert(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.diverted = err
}

package sessions

import (
	"context"
	"fmt"
)

// Places under MaxKernels. Every kernel process counts while it may run:
// the manager's kernels (starting, running, dead but listed), the warm
// pools' kernels (starting or ready), and the kernels forgotten whose
// processes are still being stopped. A user's kernel wins over the pool:
// when the pool holds the place it needs, a pooled kernel is stopped to
// make room, rather than the user getting ErrTooManyKernels while a pool
// kernel idles.
//
// With replicas (Config.PeerKernels) the other replicas' kernels take
// places too: their number is asked of the store before each check,
// holding no lock. Two replicas starting a kernel at the same moment may
// both see the last place free: the cluster-wide bound is exact only
// between starts that do not overlap.

// Lock order: a pool's p.mu may be held while these take m.mu (take,
// refill, evict), never the reverse: nothing here calls into a pool while
// holding m.mu.

// usedLocked is the number of places taken; m.mu is held.
func (m *Manager) usedLocked() int { return len(m.kernels) + m.pooled + m.stopping }

// freedLocked wakes the waiters for a place; m.mu is held.
func (m *Manager) freedLocked() {
	close(m.room)
	m.room = make(chan struct{})
}

// reserve adds k to the kernels if the limit allows. When it does not, a
// pooled kernel is stopped to make room, and reserve waits (up to ctx)
// for its process, or for a kernel already being stopped, to be gone.
func (m *Manager) reserve(ctx context.Context, k *Kernel) error {
	for {
		peers, err := m.peerKernels(ctx)
		if err != nil {
			return err
		}
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return ErrShuttingDown
		}
		if _, taken := m.kernels[k.id]; taken {
			m.mu.Unlock()
			return errorf(ErrConflict, "kernel id %s is in use", k.id)
		}
		if m.cfg.MaxKernels <= 0 || m.usedLocked()+peers < m.cfg.MaxKernels {
			m.kernels[k.id] = k
			m.mu.Unlock()
			return nil
		}
		stopping, room := m.stopping, m.room
		m.mu.Unlock()
		// Only this manager's places can be waited for: a pooled kernel
		// stopped, or one being stopped.
		if !m.warm.evict() && stopping == 0 {
			return errorf(ErrTooManyKernels, "the limit of %d kernels is reached; shut one down or try later", m.cfg.MaxKernels)
		}
		select {
		case <-room:
		case <-ctx.Done():
			return errorf(ErrTooManyKernels, "the limit of %d kernels is reached and no place was freed in time; shut one down or try later", m.cfg.MaxKernels)
		}
	}
}

// peerKernels is the number of kernels the other replicas run, 0 for a
// single gateway or with no limit.
func (m *Manager) peerKernels(ctx context.Context) (int, error) {
	if m.cfg.MaxKernels <= 0 || m.cfg.PeerKernels == nil {
		return 0, nil
	}
	n, err := m.cfg.PeerKernels(ctx)
	if err != nil {
		return 0, fmt.Errorf("sessions: counting the other replicas' kernels: %w", err)
	}
	return n, nil
}

// forget removes k from the kernels; its place is free at once (k has no
// process: use stopKernel for one that has).
func (m *Manager) forget(k *Kernel) {
	m.mu.Lock()
	if m.kernels[k.id] == k {
		delete(m.kernels, k.id)
		m.freedLocked()
	}
	m.mu.Unlock()
}

// stopKernel removes k from the kernels and shuts it down; its place is
// free once its process is gone, not before.
func (m *Manager) stopKernel(ctx context.Context, k *Kernel) {
	m.mu.Lock()
	mine := m.kernels[k.id] == k
	if mine {
		delete(m.kernels, k.id)
		m.stopping++
	}
	m.mu.Unlock()
	k.shutdown(ctx)
	if mine {
		m.stopped()
		m.disown(ctx, k.id)
	}
}

// stopped frees the place of a kernel whose process is gone.
func (m *Manager) stopped() {
	m.mu.Lock()
	m.stopping--
	m.freedLocked()
	m.mu.Unlock()
}

// claimPooled takes a place for a pool kernel about to start, if one is
// free counting peers places taken by the other replicas: the pool never
// takes the last places from users, it only fills what is free.
func (m *Manager) claimPooled(peers int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.cfg.MaxKernels > 0 && m.usedLocked()+peers >= m.cfg.MaxKernels {
		return false
	}
	m.pooled++
	return true
}

// adoptPooled moves a ready pool kernel, with its place, to the kernels.
func (m *Manager) adoptPooled(k *Kernel) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.pooled--
	m.kernels[k.id] = k
	return true
}

// pooledStopping marks a pool kernel's place as one being stopped.
func (m *Manager) pooledStopping() {
	m.mu.Lock()
	m.pooled--
	m.stopping++
	m.mu.Unlock()
}

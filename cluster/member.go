package cluster

import (
	"context"
	"slices"
	"sync"
	"time"

	"kernelgate/state"
)

// Member keeps this replica's row in the replicas table alive (renewed
// every Lease/3) and knows the live replicas: those heard from within
// the lease. Close removes the row.
type Member struct {
	store Store
	cfg   Config

	mu   sync.Mutex
	live []state.Replica // as of the last heartbeat

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// Join writes this replica's row (as started now) and starts keeping it
// alive. ctx bounds the first write and heartbeat.
func Join(ctx context.Context, store Store, cfg Config) (*Member, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if store.Replica() == "" {
		return nil, state.ErrNotReplica
	}
	if err := store.JoinReplicas(ctx, cfg.URL); err != nil {
		return nil, err
	}
	live, err := store.Heartbeat(ctx, cfg.URL, cfg.Lease)
	if err != nil {
		return nil, err
	}
	m := &Member{store: store, cfg: cfg, live: live, stop: make(chan struct{}), done: make(chan struct{})}
	go m.run()
	return m, nil
}

// ID is this replica's id.
func (m *Member) ID() string { return m.store.Replica() }

// URL is the address this replica advertises.
func (m *Member) URL() string { return m.cfg.URL }

// Live returns the live replicas as of the last heartbeat (at most
// Lease/3 old), this one among them, ordered by id.
func (m *Member) Live() []state.Replica {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.live)
}

// run renews the row every Lease/3 until Close.
func (m *Member) run() {
	defer close(m.done)
	tick := time.NewTicker(m.cfg.Lease / 3)
	defer tick.Stop()
	sweep := time.NewTicker(housekeepEvery)
	defer sweep.Stop()
	failing := false
	for {
		select {
		case <-m.stop:
			return
		case <-sweep.C:
			m.housekeep()
			continue
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Lease)
		live, err := m.store.Heartbeat(ctx, m.cfg.URL, m.cfg.Lease)
		cancel()
		switch {
		case err != nil && !failing:
			failing = true
			m.cfg.Logger.Warn("cluster: heartbeat failed; the other replicas stop seeing this one past the lease", "replica", m.ID(), "lease", m.cfg.Lease, "err", err)
		case err == nil:
			if failing {
				failing = false
				m.cfg.Logger.Info("cluster: heartbeat works again", "replica", m.ID())
			}
			m.mu.Lock()
			m.live = live
			m.mu.Unlock()
		}
	}
}

// Housekeeping: every housekeepEvery each replica removes the rows of
// replicas dead for longer than deadFor and the lease rows of kernels
// without a record that no replica has held for that long
// (state.Postgres.Housekeep). Any number of replicas doing it at once
// is harmless.
const housekeepEvery = 5 * time.Minute

// deadFor is how long a replica must have been silent, or a lease
// unheld, before its row goes: an hour, or ten leases if longer.
func (m *Member) deadFor() time.Duration { return max(time.Hour, 10*m.cfg.Lease) }

func (m *Member) housekeep() {
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Lease)
	defer cancel()
	replicas, leases, err := m.store.Housekeep(ctx, m.deadFor())
	switch {
	case err != nil:
		m.cfg.Logger.Debug("cluster: housekeeping failed; tried again later", "err", err)
	case replicas+leases > 0:
		m.cfg.Logger.Info("cluster: removed the rows of replicas long dead and the leases of kernels long gone", "replicas", replicas, "leases", leases, "dead_for", m.deadFor())
	}
}

// Close stops the heartbeat and removes this replica's row, within ctx.
// It is idempotent; later calls return nil.
func (m *Member) Close(ctx context.Context) error {
	first := false
	m.closeOnce.Do(func() {
		first = true
		close(m.stop)
	})
	if !first {
		return nil
	}
	<-m.done
	return m.store.LeaveReplicas(ctx)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"time"

	"kernelgate/cluster"
	"kernelgate/state"
)

// replica is this gateway's part among several on one PostgreSQL store:
// its row in the membership and the keeper of its kernel leases. It is
// sessions.Ownership.
type replica struct {
	store  *state.Postgres
	member *cluster.Member
	keeper *cluster.Keeper
	lease  time.Duration
}

// advertiseURL is the URL the other replicas reach this one at: given,
// else the listen address (the host's name when listening on every
// address).
func advertiseURL(given string, addr net.Addr) (string, error) {
	if given != "" {
		u, err := url.Parse(given)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "", fmt.Errorf("--advertise-url %q: want http://host:port or https://host:port", given)
		}
		return u.Scheme + "://" + u.Host, nil
	}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if host, err = os.Hostname(); err != nil {
			return "", fmt.Errorf("--advertise-url: listening on every address and the host has no name (%v): set --advertise-url", err)
		}
	}
	return "http://" + net.JoinHostPort(host, port), nil
}

// joinReplicas makes this gateway a replica: it starts keeping its
// leases (onLost told of those lost) and joins the membership.
func joinReplicas(store *state.Postgres, cfg cluster.Config, log *slog.Logger, onLost func([]state.Fence)) (*replica, error) {
	cfg.Logger = log
	if cfg.Lease == 0 {
		cfg.Lease = cluster.DefaultLease
	}
	keeper, err := cluster.NewKeeper(store, cfg, onLost)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	member, err := cluster.Join(ctx, store, cfg)
	if err != nil {
		keeper.Close()
		return nil, fmt.Errorf("joining the replicas: %w", err)
	}
	return &replica{store: store, member: member, keeper: keeper, lease: cfg.Lease}, nil
}

// URL is this replica's advertised URL.
func (r *replica) URL() string { return r.member.URL() }

// Replicas are the live replicas' URLs.
func (r *replica) Replicas() []string {
	live := r.member.Live()
	out := make([]string, 0, len(live))
	for _, l := range live {
		out = append(out, l.URL)
	}
	return out
}

// Acquire takes the kernel's lease.
func (r *replica) Acquire(ctx context.Context, kernel string) (state.Fence, error) {
	l, err := r.keeper.Acquire(ctx, kernel)
	if err != nil {
		return state.Fence{}, err
	}
	return l.Fence(), nil
}

// Lease is how long a lease lives without a renewal.
func (r *replica) Lease() time.Duration { return r.lease }

// Fence is the kernel's fence while its lease is held.
func (r *replica) Fence(kernel string) (state.Fence, bool) { return r.keeper.Fence(kernel) }

// Release gives the kernel's lease up.
func (r *replica) Release(ctx context.Context, kernel string) error {
	return r.keeper.Release(ctx, kernel)
}

// leave stops renewing and leaves the membership, within ctx; the
// leases not released lapse within the lease.
func (r *replica) leave(ctx context.Context) error {
	r.keeper.Close()
	err := r.member.Close(ctx)
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

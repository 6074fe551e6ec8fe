package main

import (
	"context"
	"errors"

	"kernelgate/cluster"
	"kernelgate/e2b"
	"kernelgate/gateway"
	"kernelgate/sessions"
	"kernelgate/state"
)

// clusterRecords is what a replica reads of the others in the store
// (gateway.Cluster): the live replicas, every record with its owner for
// the listings of a replica that did not answer, and the context tokens
// any replica minted.
type clusterRecords struct {
	mgr   *sessions.Manager
	store *state.Postgres
	rep   *cluster.Replica
}

var _ gateway.Cluster = clusterRecords{}

// Self implements gateway.Cluster.
func (cr clusterRecords) Self() string { return cr.rep.URL() }

// Replicas implements gateway.Cluster.
func (cr clusterRecords) Replicas() []string { return cr.rep.Replicas() }

// Stored implements gateway.Cluster.
func (cr clusterRecords) Stored(ctx context.Context) (*gateway.StoredListing, error) {
	l, err := cr.store.Listing(ctx)
	if err != nil {
		return nil, err
	}
	out := &gateway.StoredListing{}
	kernels := make(map[string]*state.Kernel, len(l.Kernels))
	for i, k := range l.Kernels {
		kernels[k.Rec.ID] = &l.Kernels[i].Rec
		out.Kernels = append(out.Kernels, gateway.Listed{ID: k.Rec.ID, Replica: k.OwnerURL, Model: sessions.StoredKernelModel(k.Rec, k.OwnerURL)})
	}
	for _, c := range l.Contexts {
		out.Contexts = append(out.Contexts, gateway.Listed{ID: c.Rec.ID, Replica: c.OwnerURL,
			Model: cr.mgr.StoredContextModel(c.Rec, kernels[c.Rec.KernelID], c.OwnerURL)})
	}
	for _, s := range l.Sessions {
		k := kernels[s.Rec.KernelID]
		if k == nil {
			continue // its kernel is gone: the session is not listed
		}
		out.Sessions = append(out.Sessions, gateway.Listed{ID: s.Rec.ID, Replica: s.OwnerURL, Model: sessions.StoredSessionModel(s.Rec, *k, s.OwnerURL)})
	}
	for _, sb := range l.Sandboxes {
		out.Sandboxes = append(out.Sandboxes, gateway.Listed{ID: sb.Rec.ID, Replica: sb.OwnerURL, Model: e2b.StoredModel(cr.mgr, sb.Rec)})
	}
	return out, nil
}

// ContextToken implements gateway.Cluster.
func (cr clusterRecords) ContextToken(ctx context.Context, hash [32]byte) (gateway.StoredToken, bool, error) {
	c, err := cr.store.ContextByToken(ctx, hash)
	if errors.Is(err, state.ErrNoToken) {
		return gateway.StoredToken{}, false, nil
	}
	if err != nil {
		return gateway.StoredToken{}, false, err
	}
	for _, t := range c.Tokens {
		if t.Hash == hash {
			return gateway.StoredToken{Context: c.ID, ContextCreated: c.Created, Expires: t.Expires}, true, nil
		}
	}
	return gateway.StoredToken{}, false, nil
}

// SessionByPath implements gateway.Cluster.
func (cr clusterRecords) SessionByPath(ctx context.Context, path string) (string, bool, error) {
	id, err := cr.store.SessionByPath(ctx, path)
	if errors.Is(err, state.ErrNoSuchSession) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return id, true, nil
}

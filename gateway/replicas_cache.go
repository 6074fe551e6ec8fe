package gateway

import (
	"errors"
	"sync"
	"time"

	"kernelgate/sessions"
)

// The owner cache: which replica owns a context, as this replica last
// found, kept for lease/3 from when it asked, so that a run forwarded to
// the owner of a context it ran on a moment ago costs no store lookup.
//
// Only run routes read it (forwardTo), and only for contexts this
// replica does not serve: a run forwarded to an owner that is stale (it
// lost the lease, or died) is never answered by it (a replica forwarded
// a request for something it does not own answers NOT_OWNER; one whose
// lease lapsed never sends a run), and the run relay then forgets the
// entry and asks the store again at once (runRelay.follow): a stale
// entry costs one hop, never an error. Every loss of an owner, and every
// owner the relay finds anew, replaces the entry.

// ownerCacheMax bounds the entries; past it the cache starts again empty.
const ownerCacheMax = 4096

type ownerKey struct {
	kind Kind
	id   string
}

type ownerEntry struct {
	url   string
	until time.Time
}

// ownerCache is the cache of owners; its zero value is empty and ready.
type ownerCache struct {
	mu sync.Mutex
	m  map[ownerKey]ownerEntry
}

// get returns the owner's URL kept for kind id, while it is in time.
func (oc *ownerCache) get(kind Kind, id string, now time.Time) (string, bool) {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	e, ok := oc.m[ownerKey{kind, id}]
	if !ok || !now.Before(e.until) {
		return "", false
	}
	return e.url, true
}

// put keeps url as the owner of kind id until until.
func (oc *ownerCache) put(kind Kind, id, url string, until time.Time) {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	if oc.m == nil || len(oc.m) >= ownerCacheMax {
		oc.m = map[ownerKey]ownerEntry{}
	}
	oc.m[ownerKey{kind, id}] = ownerEntry{url, until}
}

// forget drops what is kept for kind id.
func (oc *ownerCache) forget(kind Kind, id string) {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	delete(oc.m, ownerKey{kind, id})
}

// servesContext says whether this replica serves context id (or is
// handing it over): the owner cache is not read for it.
func (s *Server) servesContext(id string) bool {
	_, err := s.mgr.Context(id)
	var moved *sessions.MovedError
	return err == nil || errors.As(err, &moved)
}

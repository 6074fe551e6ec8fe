package state

import (
	"context"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Memory is a Store that keeps its records in this process only, for the
// tests of what is built on a Store. Nothing survives a restart. kernelgate
// itself never uses it: with an empty --state-dir it runs with no store at
// all (sessions.Config.Store nil) and records nothing.
type Memory struct {
	mu        sync.Mutex
	closed    bool
	kernels   map[string]Kernel
	contexts  map[string]Context
	sessions  map[string]Session
	sandboxes map[string]Sandbox
	runs      map[string]*Run
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty memory store.
func NewMemory() *Memory {
	return &Memory{kernels: map[string]Kernel{}, contexts: map[string]Context{}, sessions: map[string]Session{},
		sandboxes: map[string]Sandbox{}, runs: map[string]*Run{}}
}

// put stores v under id in m (under the store's lock).
func put[T any](s *Memory, m map[string]T, id string, v T) error {
	if id == "" {
		return ErrInvalid
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	m[id] = v
	return nil
}

func del[T any](s *Memory, m map[string]T, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	delete(m, id)
	return nil
}

func (s *Memory) PutKernel(_ context.Context, k Kernel) error { return put(s, s.kernels, k.ID, k) }
func (s *Memory) DeleteKernel(_ context.Context, id string) error {
	return del(s, s.kernels, id)
}
func (s *Memory) PutContext(_ context.Context, c Context) error { return put(s, s.contexts, c.ID, c) }
func (s *Memory) DeleteContext(_ context.Context, id string) error {
	return del(s, s.contexts, id)
}
func (s *Memory) PutSession(_ context.Context, ss Session) error {
	return put(s, s.sessions, ss.ID, ss)
}
func (s *Memory) DeleteSession(_ context.Context, id string) error {
	return del(s, s.sessions, id)
}

func (s *Memory) PutSandbox(_ context.Context, sb Sandbox) error {
	return put(s, s.sandboxes, sb.ID, sb)
}
func (s *Memory) DeleteSandbox(_ context.Context, id string) error {
	return del(s, s.sandboxes, id)
}

func (s *Memory) PutRun(id string, data []byte) error {
	if id == "" {
		return ErrInvalid
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	r := s.runs[id]
	if r == nil {
		r = &Run{ID: id}
		s.runs[id] = r
	}
	r.Data = slices.Clone(data)
	return nil
}

func (s *Memory) CommitRun(_ context.Context, id string, data []byte) error {
	return s.PutRun(id, data)
}

// CommitRunAsync calls done before it returns: a memory write is done
// at once.
func (s *Memory) CommitRunAsync(id string, data []byte, done func(error)) error {
	if err := s.PutRun(id, data); err != nil {
		return err
	}
	done(nil)
	return nil
}

func (s *Memory) AppendRunEvents(id string, events ...Event) error {
	if id == "" {
		return ErrInvalid
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	r := s.runs[id]
	if r == nil {
		r = &Run{ID: id}
		s.runs[id] = r
	}
	for _, e := range events {
		r.Events = insertEvent(r.Events, Event{Seq: e.Seq, Data: slices.Clone(e.Data)})
	}
	return nil
}

// insertEvent puts e in seq order, replacing an event of the same seq
// (as a key of the file store would be).
func insertEvent(evs []Event, e Event) []Event {
	i, found := slices.BinarySearchFunc(evs, e.Seq, func(x Event, seq uint64) int {
		switch {
		case x.Seq < seq:
			return -1
		case x.Seq > seq:
			return 1
		}
		return 0
	})
	if found {
		evs[i] = e
		return evs
	}
	return slices.Insert(evs, i, e)
}

func (s *Memory) DeleteRun(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	delete(s.runs, id)
	return nil
}

func (s *Memory) Flush(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return nil
}

func (s *Memory) Load(context.Context) (*Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	snap := &Snapshot{}
	for _, k := range s.kernels {
		snap.Kernels = append(snap.Kernels, k)
	}
	for _, c := range s.contexts {
		snap.Contexts = append(snap.Contexts, c)
	}
	for _, ss := range s.sessions {
		snap.Sessions = append(snap.Sessions, ss)
	}
	for _, sb := range s.sandboxes {
		snap.Sandboxes = append(snap.Sandboxes, sb)
	}
	for _, r := range s.runs {
		snap.Runs = append(snap.Runs, Run{ID: r.ID, Data: slices.Clone(r.Data), Events: slices.Clone(r.Events)})
	}
	snap.sort()
	return snap, nil
}

func (s *Memory) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// sort orders every list by id, as the file store reads them.
func (snap *Snapshot) sort() {
	sort.Slice(snap.Kernels, func(i, j int) bool { return snap.Kernels[i].ID < snap.Kernels[j].ID })
	sort.Slice(snap.Contexts, func(i, j int) bool { return snap.Contexts[i].ID < snap.Contexts[j].ID })
	sort.Slice(snap.Sessions, func(i, j int) bool { return snap.Sessions[i].ID < snap.Sessions[j].ID })
	sort.Slice(snap.Sandboxes, func(i, j int) bool { return snap.Sandboxes[i].ID < snap.Sandboxes[j].ID })
	slices.SortFunc(snap.Runs, func(a, b Run) int { return strings.Compare(a.ID, b.ID) })
}

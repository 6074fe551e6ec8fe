package sessions

import (
	"context"
	"sort"
	"time"

	"github.com/google/uuid"
)

// Session is a Jupyter session: a document path bound to a kernel.
type Session struct {
	ID       string
	Path     string
	Name     string
	Type     string
	KernelID string
	created  time.Time
}

// SessionModel is a session as jupyter_server 2 shows it.
type SessionModel struct {
	ID       string         `json:"id"`
	Path     string         `json:"path"`
	Name     string         `json:"name"`
	Type     string         `json:"type"`
	Kernel   *KernelModel   `json:"kernel"`
	Notebook *NotebookModel `json:"notebook,omitempty"`
}

// NotebookModel is the deprecated notebook field of notebook sessions.
type NotebookModel struct {
	Path string `json:"path"`
	Name string `json:"name"`
}

// SessionKernel names the kernel of a session request: an existing one by
// id, or a new one of a kernelspec.
type SessionKernel struct {
	ID   string
	Name string
}

// SessionRequest creates or changes a session; nil fields are unchanged.
type SessionRequest struct {
	Path, Name, Type *string
	Kernel           *SessionKernel
	// Env is passed to a new kernel as in StartOptions.
	Env map[string]string
}

// model builds the session's model, or reports that its kernel is gone.
func (m *Manager) sessionModel(s *Session) (SessionModel, bool) {
	k, err := m.Kernel(s.KernelID)
	if err != nil {
		return SessionModel{}, false
	}
	km := k.Model()
	sm := SessionModel{ID: s.ID, Path: s.Path, Name: s.Name, Type: s.Type, Kernel: &km}
	if s.Type == "notebook" {
		sm.Notebook = &NotebookModel{Path: s.Path, Name: s.Name}
	}
	return sm, true
}

// Sessions lists the sessions whose kernel is alive, dropping the others.
func (m *Manager) Sessions() []SessionModel {
	m.mu.Lock()
	ss := make([]*Session, 0, len(m.sessions))
	for _, s := range m.sessions {
		ss = append(ss, s)
	}
	m.mu.Unlock()
	sort.Slice(ss, func(i, j int) bool { return ss[i].created.Before(ss[j].created) })
	out := []SessionModel{}
	for _, s := range ss {
		if sm, ok := m.sessionModel(s); ok {
			out = append(out, sm)
		} else {
			m.dropSession(s.ID)
		}
	}
	return out
}

// Session returns one session.
func (m *Manager) Session(id string) (SessionModel, error) {
	m.mu.Lock()
	s, ok := m.sessions[id]
	m.mu.Unlock()
	if ok {
		if sm, alive := m.sessionModel(s); alive {
			return sm, nil
		}
		m.dropSession(id)
	}
	return SessionModel{}, errorf(ErrNoSuchSession, "Session not found: %s", id)
}

func (m *Manager) dropSession(id string) {
	m.mu.Lock()
	_, ok := m.sessions[id]
	delete(m.sessions, id)
	m.mu.Unlock()
	if ok {
		m.deleteSessionRecord(id)
	}
}

// sessionForPath returns the live session of path, if any.
func (m *Manager) sessionForPath(path string) (SessionModel, bool) {
	m.mu.Lock()
	var found *Session
	for _, s := range m.sessions {
		if s.Path == path {
			found = s
			break
		}
	}
	m.mu.Unlock()
	if found == nil {
		return SessionModel{}, false
	}
	sm, ok := m.sessionModel(found)
	if !ok {
		m.dropSession(found.ID)
	}
	return sm, ok
}

// kernelFor returns the kernel a session request names, starting one if
// needed (an id that is not a live kernel starts a new one, as
// jupyter_server does).
func (m *Manager) kernelFor(ctx context.Context, sk *SessionKernel, env map[string]string) (*Kernel, error) {
	if sk != nil && sk.ID != "" {
		if k, err := m.Kernel(sk.ID); err == nil {
			return k, nil
		}
	}
	o := StartOptions{Env: env}
	if sk != nil {
		o.Name = sk.Name
	}
	return m.StartKernel(ctx, o)
}

// CreateSession creates a session, or returns the one already open for
// the path.
func (m *Manager) CreateSession(ctx context.Context, r SessionRequest) (SessionModel, error) {
	if r.Path == nil || *r.Path == "" {
		return SessionModel{}, errorf(ErrBadRequest, "a session needs a path")
	}
	if r.Type == nil || *r.Type == "" {
		return SessionModel{}, errorf(ErrBadRequest, "a session needs a type (notebook, console or file)")
	}
	if sm, ok := m.sessionForPath(*r.Path); ok {
		return sm, nil
	}
	k, err := m.kernelFor(ctx, r.Kernel, r.Env)
	if err != nil {
		return SessionModel{}, err
	}
	s := &Session{ID: uuid.NewString(), Path: *r.Path, Type: *r.Type, KernelID: k.id, created: time.Now()}
	if r.Name != nil {
		s.Name = *r.Name
	}
	m.putSession(*s)
	m.mu.Lock()
	m.sessions[s.ID] = s
	m.mu.Unlock()
	sm, _ := m.sessionModel(s)
	return sm, nil
}

// UpdateSession changes a session's path, name, type or kernel. A new
// kernel replaces the old one, which is shut down unless another session
// uses it.
func (m *Manager) UpdateSession(ctx context.Context, id string, r SessionRequest) (SessionModel, error) {
	m.mu.Lock()
	s, ok := m.sessions[id]
	var cur Session
	if ok {
		cur = *s
	}
	m.mu.Unlock()
	if !ok {
		return SessionModel{}, errorf(ErrNoSuchSession, "Session not found: %s", id)
	}
	next := cur
	if r.Path != nil {
		next.Path = *r.Path
	}
	if r.Name != nil {
		next.Name = *r.Name
	}
	if r.Type != nil {
		next.Type = *r.Type
	}
	if r.Kernel != nil {
		if r.Kernel.ID != "" {
			if _, err := m.Kernel(r.Kernel.ID); err != nil {
				return SessionModel{}, errorf(ErrBadRequest, "no kernel with id %s", r.Kernel.ID)
			}
			next.KernelID = r.Kernel.ID
		} else {
			k, err := m.StartKernel(ctx, StartOptions{Name: r.Kernel.Name, Env: r.Env})
			if err != nil {
				return SessionModel{}, err
			}
			next.KernelID = k.id
		}
	}
	m.mu.Lock()
	if s, ok = m.sessions[id]; !ok {
		m.mu.Unlock()
		return SessionModel{}, errorf(ErrNoSuchSession, "Session not found: %s", id)
	}
	*s = next
	shared := false
	for _, o := range m.sessions {
		if o.KernelID == cur.KernelID {
			shared = true
		}
	}
	m.mu.Unlock()
	m.putSession(next)
	if next.KernelID != cur.KernelID && !shared {
		m.ShutdownKernel(ctx, cur.KernelID)
	}
	sm, ok := m.sessionModel(&next)
	if !ok {
		return SessionModel{}, errorf(ErrKernelGone, "the session's kernel is gone")
	}
	return sm, nil
}

// DeleteSession deletes a session and shuts its kernel down.
func (m *Manager) DeleteSession(ctx context.Context, id string) error {
	m.mu.Lock()
	s, ok := m.sessions[id]
	delete(m.sessions, id)
	m.mu.Unlock()
	if !ok {
		return errorf(ErrNoSuchSession, "Session not found: %s", id)
	}
	m.deleteSessionRecord(id)
	if err := m.ShutdownKernel(ctx, s.KernelID); err != nil {
		return errorf(ErrKernelGone, "Kernel deleted before session")
	}
	return nil
}

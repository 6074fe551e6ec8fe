package sessions

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"

	"kernelgate/state"
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

// JupyterSessions are the Jupyter sessions: document paths bound to
// kernels (the Jupyter Server's /api/sessions).
type JupyterSessions struct {
	m *Manager

	mu   sync.Mutex
	byID map[string]*Session
}

// JupyterSessions are the manager's Jupyter sessions.
func (m *Manager) JupyterSessions() *JupyterSessions { return m.jsessions }

// model builds the session's model, or reports that its kernel is gone.
func (js *JupyterSessions) model(s *Session) (SessionModel, bool) {
	k, err := js.m.Kernel(s.KernelID)
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

// List lists the sessions whose kernel is alive, dropping the others.
func (js *JupyterSessions) List() []SessionModel {
	js.mu.Lock()
	ss := make([]*Session, 0, len(js.byID))
	for _, s := range js.byID {
		ss = append(ss, s)
	}
	js.mu.Unlock()
	sort.Slice(ss, func(i, j int) bool { return ss[i].created.Before(ss[j].created) })
	out := []SessionModel{}
	for _, s := range ss {
		if sm, ok := js.model(s); ok {
			out = append(out, sm)
		} else {
			js.drop(s.ID)
		}
	}
	return out
}

// Get returns one session.
func (js *JupyterSessions) Get(id string) (SessionModel, error) {
	js.mu.Lock()
	s, ok := js.byID[id]
	js.mu.Unlock()
	if ok {
		if sm, alive := js.model(s); alive {
			return sm, nil
		}
		js.drop(id)
	}
	return SessionModel{}, errorf(ErrNoSuchSession, "Session not found: %s", id)
}

func (js *JupyterSessions) drop(id string) {
	js.mu.Lock()
	s, ok := js.byID[id]
	delete(js.byID, id)
	js.mu.Unlock()
	if ok {
		js.deleteRecord(id, s.KernelID)
	}
}

// forPath returns the live session of path, if any.
func (js *JupyterSessions) forPath(path string) (SessionModel, bool) {
	js.mu.Lock()
	var found *Session
	for _, s := range js.byID {
		if s.Path == path {
			found = s
			break
		}
	}
	js.mu.Unlock()
	if found == nil {
		return SessionModel{}, false
	}
	sm, ok := js.model(found)
	if !ok {
		js.drop(found.ID)
	}
	return sm, ok
}

// kernelFor returns the kernel a session request names, starting one if
// needed (an id that is not a live kernel starts a new one, as
// jupyter_server does).
func (js *JupyterSessions) kernelFor(ctx context.Context, sk *SessionKernel, env map[string]string) (*Kernel, error) {
	if sk != nil && sk.ID != "" {
		if k, err := js.m.Kernel(sk.ID); err == nil {
			return k, nil
		}
	}
	o := StartOptions{Env: env}
	if sk != nil {
		o.Name = sk.Name
	}
	return js.m.StartKernel(ctx, o)
}

// Create creates a session, or returns the one already open for
// the path.
func (js *JupyterSessions) Create(ctx context.Context, r SessionRequest) (SessionModel, error) {
	if r.Path == nil || *r.Path == "" {
		return SessionModel{}, errorf(ErrBadRequest, "a session needs a path")
	}
	if r.Type == nil || *r.Type == "" {
		return SessionModel{}, errorf(ErrBadRequest, "a session needs a type (notebook, console or file)")
	}
	if sm, ok := js.forPath(*r.Path); ok {
		return sm, nil
	}
	k, err := js.kernelFor(ctx, r.Kernel, r.Env)
	if err != nil {
		return SessionModel{}, err
	}
	s := &Session{ID: uuid.NewString(), Path: *r.Path, Type: *r.Type, KernelID: k.id, created: time.Now()}
	if r.Name != nil {
		s.Name = *r.Name
	}
	js.put(*s)
	js.mu.Lock()
	js.byID[s.ID] = s
	js.mu.Unlock()
	sm, _ := js.model(s)
	return sm, nil
}

// Update changes a session's path, name, type or kernel. A new
// kernel replaces the old one, which is shut down unless another session
// uses it.
func (js *JupyterSessions) Update(ctx context.Context, id string, r SessionRequest) (SessionModel, error) {
	js.mu.Lock()
	s, ok := js.byID[id]
	var cur Session
	if ok {
		cur = *s
	}
	js.mu.Unlock()
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
			if _, err := js.m.Kernel(r.Kernel.ID); err != nil {
				return SessionModel{}, errorf(ErrBadRequest, "no kernel with id %s", r.Kernel.ID)
			}
			next.KernelID = r.Kernel.ID
		} else {
			k, err := js.m.StartKernel(ctx, StartOptions{Name: r.Kernel.Name, Env: r.Env})
			if err != nil {
				return SessionModel{}, err
			}
			next.KernelID = k.id
		}
	}
	js.mu.Lock()
	if s, ok = js.byID[id]; !ok {
		js.mu.Unlock()
		return SessionModel{}, errorf(ErrNoSuchSession, "Session not found: %s", id)
	}
	*s = next
	shared := false
	for _, o := range js.byID {
		if o.KernelID == cur.KernelID {
			shared = true
		}
	}
	js.mu.Unlock()
	js.put(next)
	if next.KernelID != cur.KernelID && !shared {
		js.m.ShutdownKernel(ctx, cur.KernelID)
	}
	sm, ok := js.model(&next)
	if !ok {
		return SessionModel{}, errorf(ErrKernelGone, "the session's kernel is gone")
	}
	return sm, nil
}

// Delete deletes a session and shuts its kernel down.
func (js *JupyterSessions) Delete(ctx context.Context, id string) error {
	js.mu.Lock()
	s, ok := js.byID[id]
	delete(js.byID, id)
	js.mu.Unlock()
	if !ok {
		return errorf(ErrNoSuchSession, "Session not found: %s", id)
	}
	js.deleteRecord(id, s.KernelID)
	if err := js.m.ShutdownKernel(ctx, s.KernelID); err != nil {
		return errorf(ErrKernelGone, "Kernel deleted before session")
	}
	return nil
}

// put records a Jupyter session.
func (js *JupyterSessions) put(s Session) {
	if js.m.store == nil {
		return
	}
	ctx, cancel := storeCtx()
	defer cancel()
	rec := state.Session{ID: s.ID, Path: s.Path, Name: s.Name, Type: s.Type, KernelID: s.KernelID, Created: s.created}
	if err := js.m.writer(rec.KernelID).PutSession(ctx, rec); err != nil {
		js.m.log.Error("state: session not recorded: a restart of the gateway loses it", "session", s.ID, "err", err)
	}
}

// deleteRecord deletes the record of session id, whose kernel is
// kernel: under its fence, as the record was written.
func (js *JupyterSessions) deleteRecord(id, kernel string) {
	if js.m.store == nil {
		return
	}
	ctx, cancel := storeCtx()
	defer cancel()
	if err := js.m.writer(kernel).DeleteSession(ctx, id); err != nil {
		js.m.log.Error("state: session record not deleted", "session", id, "err", err)
	}
}

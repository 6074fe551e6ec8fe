package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"kernelgate/state"
)

// Among replicas a language's shared context (code-python, …) is one for
// the cluster: the first replica to need it claims it in the store
// before starting its kernel (state.Postgres.ClaimContext: of replicas
// claiming at once one wins), and the others send its runs to the winner.

// ErrSharedElsewhere: another replica serves the shared context a run
// without context goes to; the request is the owner's (SharedElsewhere
// has its URL).
var ErrSharedElsewhere = errors.New("sessions: another replica serves this shared context")

// SharedElsewhere is ErrSharedElsewhere with the context and the owner.
type SharedElsewhere struct {
	Context string
	// URL is the advertised URL of the replica that serves it.
	URL string
}

func (e *SharedElsewhere) Error() string {
	return fmt.Sprintf("%v: %s is served by %s", ErrSharedElsewhere, e.Context, e.URL)
}

// Unwrap makes errors.Is(err, ErrSharedElsewhere) hold.
func (e *SharedElsewhere) Unwrap() error { return ErrSharedElsewhere }

// contextClaimer claims a context for the kernel whose lease this
// replica holds (state.Postgres among replicas).
type contextClaimer interface {
	ClaimContext(ctx context.Context, rec state.Context, f state.Fence) (state.Lease, error)
}

var _ contextClaimer = (*state.Postgres)(nil)

// claimer is the store's claims among replicas, nil for a single gateway.
func (m *Manager) claimer() contextClaimer {
	if m.cfg.Ownership == nil {
		return nil
	}
	cl, _ := m.store.(contextClaimer)
	return cl
}

// SharedID is the id of the shared context a run without context of
// language and kernelspec goes to (code-python, …); "" when they name no
// kernelspec installed.
func (cat *Catalog) SharedID(language, kernelspec string) string {
	choice, err := cat.chooseKernel(language, kernelspec)
	if err != nil {
		return ""
	}
	return choice.shared
}

// clusterSharedContext is sharedContext among replicas: the shared
// context of choice, this replica's if it has it, else claimed in the
// store for a kernel this replica will start, unless another replica
// holds it (SharedElsewhere). Claims of one id here wait for each other.
func (m *Manager) clusterSharedContext(cl contextClaimer, req ExecuteRequest, choice kernelChoice) (*Context, error) {
	id := choice.shared
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return nil, ErrShuttingDown
		}
		c, ok := m.contexts[id]
		wait, busy := m.claiming[id]
		if !ok && !busy {
			if m.claiming == nil {
				m.claiming = map[string]chan struct{}{}
			}
			m.claiming[id] = make(chan struct{})
		}
		m.mu.Unlock()
		switch {
		case ok:
			if req.Env != nil && !sameEnv(req.Env, c.Env) {
				return nil, errorf(ErrUnsupported, "the shared kernel %s was started with another env; create a context for this env", id)
			}
			return c, nil
		case busy:
			<-wait
			continue
		}
		break
	}
	defer func() {
		m.mu.Lock()
		done := m.claiming[id]
		delete(m.claiming, id)
		m.mu.Unlock()
		close(done)
	}()
	ws, err := m.newWorkspace(contextWorkspace(id), choice.spec)
	if err != nil {
		return nil, err
	}
	cwd, err := resolveCwd(ws, req.Cwd)
	if err != nil {
		ws.Close()
		return nil, err
	}
	// The kernel's lease first, then the claim naming it: a replica
	// that finds the claim finds its owner.
	kernel := newID()
	if err := m.own(kernel); err != nil {
		ws.Close()
		return nil, err
	}
	f, _ := m.cfg.Ownership.Fence(kernel)
	created := time.Now()
	ex := contextExtra{Shared: true}
	if m.cfg.Languages[choice.language] != choice.spec.Name {
		ex.Kernelspec = choice.spec.Name
	}
	rec := state.Context{ID: id, Language: choice.language, Cwd: cwd, Env: req.Env, KernelID: kernel, Created: created}
	rec.Extra, _ = json.Marshal(ex)
	ctx, cancel := context.WithTimeout(m.closingCtx, ownTimeout)
	defer cancel()
	held, err := cl.ClaimContext(ctx, rec, f)
	if err != nil {
		m.disown(ctx, kernel)
		ws.Close()
		if errors.Is(err, state.ErrLeaseHeld) {
			return nil, &SharedElsewhere{Context: id, URL: held.OwnerURL}
		}
		return nil, err
	}
	c := &Context{ID: id, Language: choice.language, Cwd: cwd, Env: req.Env, Shared: true, m: m, spec: choice.spec, ws: ws,
		created: created, claimed: kernel}
	c.initRuns()
	m.mu.Lock()
	closed := m.closed
	if !closed {
		m.contexts[id] = c
	}
	m.mu.Unlock()
	if closed {
		m.disown(ctx, kernel)
		ws.Close()
		return nil, ErrShuttingDown
	}
	return c, nil
}

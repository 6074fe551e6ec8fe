package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"kernelgate/jupyter"
	"kernelgate/runs"
	"kernelgate/state"
	"kernelgate/workspace"
)

// This file is a gateway's start on a store an earlier gateway kept
// (persist.go): it re-adopts the kernels still running, restores the
// contexts, Jupyter sessions and run records, and picks up the runs that
// a kernel it adopted is still running.

// promptAdopt is how long a start waits for a kept kernel to answer
// before it serves without it. One that has not answered by then (busy
// with a long request, in a way that keeps it from answering even on its
// control channel) is kept and adopted once it answers (adoption).
const promptAdopt = 2 * time.Second

// stopTimeout bounds the stop of a kept kernel that is not adopted.
const stopTimeout = 20 * time.Second

// restoreParallel is how many kept kernels are connected to at once.
const restoreParallel = 16

// endedWhileDown is how a kept kernel that is gone is said to have ended.
const endedWhileDown = "ended while no gateway was running"

// RestoreReport says what a start found in the store.
type RestoreReport struct {
	// Adopted are the kernels running again under their ids; Pending
	// the kept kernels, the same live processes, that had not answered
	// yet (busy), adopted once they answer; Lost the kept kernels that
	// were gone (or answered with another key and were stopped); Stopped
	// the warm-pool and isolated-run kernels ended.
	Adopted, Pending, Lost, Stopped int
	Contexts, Sessions              int
	// Runs are the run records restored; PickedUp those still running.
	Runs, PickedUp int
	// Keep are the ids of the kernels adopted or pending: their
	// processes, directories and cgroups are not leftovers.
	Keep []string
}

// restoration is a Restore in progress: its steps take the kept
// kernels, contexts and runs over.
type restoration struct{ m *Manager }

// Restore loads what the store kept and takes it over: call it once,
// before serving. Without a store it does nothing.
func (m *Manager) Restore(ctx context.Context) (RestoreReport, error) {
	var rep RestoreReport
	if m.store == nil {
		return rep, nil
	}
	snap, err := m.store.Load(ctx)
	if err != nil {
		return rep, err
	}
	t0 := time.Now()
	rt := restoration{m}
	if m.cfg.Ownership != nil {
		owned := rt.owned(ctx, *snap)
		snap = &owned
	}
	rep = rt.take(ctx, snap)
	m.log.Info("state restored", "kernels", rep.Adopted, "pending", rep.Pending, "lost", rep.Lost, "stopped", rep.Stopped,
		"contexts", rep.Contexts, "sessions", rep.Sessions, "runs", rep.Runs, "picked_up", rep.PickedUp,
		"took", time.Since(t0).Round(time.Millisecond))
	if m.cfg.Ownership != nil {
		m.goroutine(m.failover)
	}
	return rep, nil
}

// take takes over the kernels, contexts, Jupyter sessions and runs of
// snap (at start, or another replica's a failover hands over).
func (rt restoration) take(ctx context.Context, snap *state.Snapshot) RestoreReport {
	m := rt.m
	var rep RestoreReport
	rt.leaveElsewhere(ctx, snap)

	// The contexts say which kernels of the lazy policy are theirs; the
	// others (warm pool, isolated runs) end.
	wanted := map[string]*state.Context{}
	for i := range snap.Contexts {
		if id := snap.Contexts[i].KernelID; id != "" {
			wanted[id] = &snap.Contexts[i]
		}
	}
	workspaces := map[string]*workspace.Workspace{}
	for _, rec := range snap.Contexts {
		spec, err := m.catalog.contextSpec(rec.Language, contextExtraOf(rec).Kernelspec)
		if err != nil {
			continue
		}
		name := contextWorkspaceOf(rec)
		if _, ok := workspaces[name]; ok {
			continue // shared by several contexts
		}
		if ws, err := m.newWorkspace(name, spec); err == nil {
			workspaces[name] = ws
		}
	}

	var mu sync.Mutex
	kernels := map[string]*Kernel{}
	sem := make(chan struct{}, restoreParallel)
	var wg sync.WaitGroup
	for _, rec := range snap.Kernels {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			k, outcome := rt.kernel(ctx, rec, wanted[rec.ID] != nil, workspaces)
			mu.Lock()
			defer mu.Unlock()
			switch outcome {
			case adopted:
				rep.Adopted++
				rep.Keep = append(rep.Keep, k.id)
			case pending:
				rep.Pending++
				rep.Keep = append(rep.Keep, k.id)
			case lost:
				rep.Lost++
			case stopped:
				rep.Stopped++
			}
			if k != nil {
				kernels[k.id] = k
			}
		}()
	}
	wg.Wait()

	m.mu.Lock()
	for id, k := range kernels {
		m.kernels[id] = k
	}
	m.mu.Unlock()

	contexts := map[string]*Context{}
	for _, rec := range snap.Contexts {
		c := rt.context(rec, kernels, workspaces)
		if c != nil {
			contexts[c.ID] = c
			rep.Contexts++
		}
	}
	for _, rec := range snap.Sessions {
		if _, ok := kernels[rec.KernelID]; !ok {
			m.jsessions.deleteRecord(rec.ID, rec.KernelID)
			continue
		}
		s := &Session{ID: rec.ID, Path: rec.Path, Name: rec.Name, Type: rec.Type, KernelID: rec.KernelID, created: rec.Created}
		m.jsessions.mu.Lock()
		m.jsessions.byID[s.ID] = s
		m.jsessions.mu.Unlock()
		rep.Sessions++
	}
	rep.Runs, rep.PickedUp = rt.runs(snap.Runs, contexts)
	return rep
}

type restoreOutcome int

const (
	adopted restoreOutcome = iota
	pending
	lost
	stopped
)

// kernel connects to the kept kernel rec names, if it is the same
// live process and answers with its key. A kernel of a context (wanted)
// or of the Jupyter surface comes back under its id either way: adopted;
// pending, when it has not answered within promptAdopt (it is adopted
// once it does); or dead as if it had died (a context's next run starts a
// new process and says the state was lost; a Jupyter kernel restarts
// now). Others (warm pool, isolated runs) are stopped.
func (rt restoration) kernel(ctx context.Context, rec state.Kernel, wanted bool, workspaces map[string]*workspace.Workspace) (*Kernel, restoreOutcome) {
	m := rt.m
	var ex kernelExtra
	if len(rec.Extra) > 0 {
		json.Unmarshal(rec.Extra, &ex)
	}
	info, infoErr := jupyter.UnmarshalProvisionerInfo(rec.ProvisionerInfo)
	stop := func(why string) {
		if infoErr == nil {
			sctx, cancel := context.WithTimeout(ctx, stopTimeout)
			if err := m.stopKept(sctx, info); err != nil && !errors.Is(err, jupyter.ErrNotAdoptable) {
				m.log.Warn("kept kernel not stopped", "kernel", rec.ID, "err", err)
			}
			cancel()
		}
		m.log.Info("kept kernel stopped", "kernel", rec.ID, "why", why)
	}
	spec, err := m.catalog.Spec(rec.Spec)
	if err != nil || (ex.Policy == restartLazily && !wanted) {
		why := "a warm-pool or isolated-run kernel"
		if err != nil {
			why = "its kernelspec is gone"
		}
		stop(why)
		m.records.deleteKernel(rec.ID)
		if strings.HasPrefix(ex.Workspace, "runs/") && m.wsRoot != nil {
			if ws, err := m.wsRoot.Open(ex.Workspace, nil); err == nil {
				ws.Delete()
			}
		}
		return nil, stopped
	}
	var ws *workspace.Workspace
	if ex.Workspace != "" {
		ws = workspaces[ex.Workspace]
	}
	k, err := m.newKernel(rec.ID, spec, ex.Env, workDir{ws: ws, cwd: rec.Cwd}, ex.Policy)
	if err != nil {
		stop(err.Error())
		m.records.deleteKernel(rec.ID)
		return nil, stopped
	}
	k.created = rec.Created
	if !rec.LastActivity.IsZero() {
		k.lastAct, k.recordedAct = rec.LastActivity, rec.LastActivity
	}
	if infoErr != nil {
		err = infoErr
	} else {
		// The connection outlives the start when the kernel is busy:
		// cancelAdoption or the manager's close ends it.
		actx, cancel := context.WithCancel(context.Background())
		var conn connecting
		if conn, err = m.reconnect(actx, info, k.config()); err != nil {
			cancel()
		} else {
			t := time.NewTimer(m.promptAdopt)
			select {
			case <-conn.Done():
				t.Stop()
				var jk process
				jk, err = conn.Result()
				cancel()
				if err == nil {
					k.adopted(jk)
					return k, adopted
				}
			case <-t.C:
				a := &adoption{conn: conn, info: info, cancel: cancel, done: make(chan struct{})}
				k.mu.Lock()
				k.adopting = a
				k.gen = 1
				k.state = jupyter.StateBusy
				k.ready = make(chan struct{})
				k.mu.Unlock()
				m.log.Info("kept kernel busy: it is adopted once it answers", "kernel", k.id, "spec", spec.Name, "pid", conn.PID())
				m.goroutine(func() { k.awaitAdoption(a) })
				return k, pending
			}
		}
	}
	// Gone, another process now, or not answering with its key: it is
	// not this kernel any more (a live one is stopped).
	m.log.Warn("kept kernel lost: "+endedWhileDown, "kernel", k.id, "spec", spec.Name, "err", err)
	if !errors.Is(err, jupyter.ErrNotAdoptable) || infoErr == nil {
		stop("it could not be adopted")
	}
	k.lostKept(endedWhileDown, "the kernel "+endedWhileDown)
	return k, lost
}

// adopted makes jk, a kept kernel's process that answered with its key,
// the kernel's process.
func (k *Kernel) adopted(jk process) {
	lateWait, _ := k.m.catalog.lateOutputWait(k.spec, jk.Info().Implementation)
	k.mu.Lock()
	k.jk = jk
	k.lateWait = lateWait
	k.gen = 1
	k.state = jupyter.StateIdle
	if len(k.pickups) > 0 {
		k.state = jupyter.StateBusy
	}
	k.reason = ""
	if k.ready != nil {
		close(k.ready)
		k.ready = nil
	}
	k.mu.Unlock()
	k.m.goroutine(func() { k.watch(jk) })
	k.m.log.Info("kernel adopted", "kernel", k.id, "spec", k.spec.Name, "pid", jk.PID())
}

// lostKept reports a kept kernel that could not be adopted the way a
// death is (endedBy says how it ended, reason why it is dead): a
// context's kernel stays dead until its next run, a Jupyter kernel
// restarts now. Its process, if it lived, was stopped.
func (k *Kernel) lostKept(endedBy, reason string) {
	m := k.m
	m.cfg.Observer.KernelDied(k.spec.Name)
	k.mu.Lock()
	k.endedBy = endedBy
	restart := k.policy == restartNow && !k.removed
	if restart {
		k.state = jupyter.StateRestarting
		if k.ready == nil {
			k.ready = make(chan struct{})
		}
	} else {
		k.state = jupyter.StateDead
		k.reason = reason
		if k.ready != nil {
			close(k.ready)
			k.ready = nil
		}
	}
	k.mu.Unlock()
	if restart {
		m.goroutine(func() {
			k.life.Lock()
			defer k.life.Unlock()
			k.mu.Lock()
			still := k.jk == nil && k.ready != nil && !k.removed
			k.mu.Unlock()
			if !still { // restarted or shut down meanwhile
				return
			}
			m.cfg.Observer.KernelRestarted(k.spec.Name, "died")
			if err := k.launch(context.Background()); err != nil {
				m.log.Warn("kernel restart failed", "kernel", k.id, "err", err)
			}
		})
	}
}

// adoption is a kept kernel, the same live process, that had not answered
// when the gateway started serving: its connection goes on in the
// background (awaitAdoption) until the kernel answers with its key (it is
// adopted), dies or answers with another key (it is lost, as a kernel
// that ended while no gateway ran), or the kernel is restarted, shut
// down or left (cancelAdoption). Meanwhile runs wait for it as for a
// kernel starting, and an interrupt reaches it.
type adoption struct {
	conn   connecting
	info   jupyter.ProvisionerInfo
	cancel context.CancelFunc
	done   chan struct{} // closed once it is over

	// guarded by the kernel's mu
	cancelled bool // cancelAdoption gave it up
	left      bool // it ended without adopting or stopping the process
}

// awaitAdoption waits for a's kernel to answer and adopts it, or reports
// it lost.
func (k *Kernel) awaitAdoption(a *adoption) {
	m := k.m
	select {
	case <-a.conn.Done():
	case <-m.closing:
	}
	a.cancel()
	jk, err := a.conn.Result()
	k.life.Lock()
	defer k.life.Unlock()
	k.mu.Lock()
	removed := k.removed
	gaveUp := a.cancelled || removed || errors.Is(err, context.Canceled)
	if err != nil && gaveUp {
		// Whoever gave it up decides what becomes of the process
		// (cancelAdoption): it is left running.
		a.left = true
		if k.ready != nil {
			close(k.ready)
			k.ready = nil
		}
		k.mu.Unlock()
		close(a.done)
		return
	}
	k.adopting = nil
	k.mu.Unlock()
	if err == nil {
		if removed {
			jk.Shutdown(context.Background())
		} else {
			k.adopted(jk)
		}
		close(a.done)
		return
	}
	// It died, or signs with another key: a live one is stopped.
	m.log.Warn("kept kernel lost", "kernel", k.id, "spec", k.spec.Name, "err", err)
	sctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	k.stopAdoptee(sctx, a)
	cancel()
	why := "could not be adopted after the gateway restarted (" + err.Error() + ")"
	k.lostKept(why, "the kernel "+why)
	close(a.done)
}

// cancelAdoption gives up adopting the kernel, if it is being adopted,
// and waits until that is over. It returns the adoption when its process
// was left running (a shutdown or restart then stops it: stopAdoptee),
// nil when there was none or it ended otherwise. The caller does not hold
// k.life.
func (k *Kernel) cancelAdoption() *adoption {
	k.mu.Lock()
	a := k.adopting
	if a != nil {
		a.cancelled = true
	}
	k.mu.Unlock()
	if a == nil {
		return nil
	}
	a.cancel()
	<-a.done
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.adopting == a {
		k.adopting = nil
	}
	if !a.left {
		return nil
	}
	return a
}

// stopAdoptee stops the kept process of an adoption of k given up.
func (k *Kernel) stopAdoptee(ctx context.Context, a *adoption) {
	if err := k.m.stopKept(ctx, a.info); err != nil && !errors.Is(err, jupyter.ErrNotAdoptable) {
		k.m.log.Warn("kept kernel not stopped", "kernel", k.id, "err", err)
	}
}

// context takes a kept context over, with its kernel when that is
// back.
func (rt restoration) context(rec state.Context, kernels map[string]*Kernel, workspaces map[string]*workspace.Workspace) *Context {
	m := rt.m
	ex := contextExtraOf(rec)
	spec, err := m.catalog.contextSpec(rec.Language, ex.Kernelspec)
	ws := workspaces[contextWorkspaceOf(rec)]
	if err != nil || ws == nil {
		m.log.Warn("kept context dropped", "context", rec.ID, "err", err)
		m.records.deleteContext(&Context{ID: rec.ID})
		return nil
	}
	c := &Context{ID: rec.ID, Language: rec.Language, Cwd: rec.Cwd, Env: rec.Env, Shared: ex.Shared, m: m, spec: spec, ws: ws,
		wsBorrowed: ex.Workspace != "", created: rec.Created, tokens: rec.Tokens}
	c.initRuns()
	if k := kernels[rec.KernelID]; k != nil {
		// A lost kernel is at generation 0: its next process is the
		// first, and the next run says the state is gone.
		c.kernel = k
		c.runs.Restored(kernelRunner{k: k}, "")
	} else if rec.KernelID != "" {
		c.runs.Restored(nil, "was shut down with the gateway")
	}
	m.mu.Lock()
	m.contexts[c.ID] = c
	m.mu.Unlock()
	return c
}

// runs takes the kept run records over: ended ones as they are,
// queued ones end (they never ran), running ones (and queued ones whose
// code was being sent) are picked up when their kernel is back, else
// lost.
func (rt restoration) runs(recs []state.Run, contexts map[string]*Context) (restored, pickedUp int) {
	m := rt.m
	kept := m.runs.Restore(recs)
	var send []runs.Restored // queued runs sent here, after those picked up
	for _, kr := range kept {
		r := kr.Run
		c := contexts[r.Context]
		if r.State() == runs.RunQueued && m.cfg.Ownership != nil && !kr.Command && c != nil {
			// Among replicas a run recorded queued, never sent (its owner
			// died or froze with it queued, or before the run forwarded
			// to it arrived), is sent here, once: a run is recorded as
			// sent before its code goes.
			send = append(send, kr)
			continue
		}
		if c != nil {
			c.runs.NoteRun(r.ID)
		}
		switch r.State() {
		case runs.RunQueued:
			r.Lose("the gateway restarted before the run started; it never ran")
		case runs.RunRunning:
			var k *Kernel
			live := false
			if c != nil {
				c.mu.Lock()
				k = c.kernel
				c.mu.Unlock()
			}
			if k != nil && k.id == kr.Kernel && kr.MsgID != "" {
				k.mu.Lock()
				live = k.jk != nil || k.adopting != nil
				k.mu.Unlock()
			}
			if !live {
				why := "the gateway restarted during the run and its kernel " + endedWhileDown + "; the next run starts a new kernel without the earlier state"
				if c != nil {
					c.runs.Lose(r, why)
				} else {
					r.Lose(why)
				}
				continue
			}
			pickedUp++
			c.runs.PickUp(r, kernelFollowed{k})
		}
	}
	for _, kr := range send {
		c := contexts[kr.Run.Context]
		if err := c.runs.Enqueue(kr.Run); err != nil {
			kr.Run.Lose("the replica that owned the context stopped before the run started, and it could not be queued here: " + err.Error() + "; it never ran")
		}
	}
	return len(kept), pickedUp
}

// kernelFollowed is a kept kernel as a picked-up run's runs.Followed.
type kernelFollowed struct{ k *Kernel }

var _ runs.Followed = kernelFollowed{}

func (f kernelFollowed) Route(msgID string, h func(*Message)) (undo func()) {
	k := f.k
	k.mu.Lock()
	if k.pickups == nil {
		k.pickups = map[string]func(*Message){}
	}
	if k.runs == nil {
		k.runs = map[string]struct{}{}
	}
	k.runs[msgID] = struct{}{}
	k.state = jupyter.StateBusy
	k.pickups[msgID] = h
	k.mu.Unlock()
	return func() {
		k.mu.Lock()
		delete(k.pickups, msgID)
		delete(k.runs, msgID)
		k.mu.Unlock()
	}
}

func (f kernelFollowed) Process() (runs.Process, <-chan struct{}) {
	k := f.k
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.jk != nil {
		return followedProcess{k.jk}, nil
	}
	if k.adopting != nil {
		return nil, k.adopting.done
	}
	return nil, nil
}

func (f kernelFollowed) Adopted() (runs.Process, string) {
	k := f.k
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.jk == nil {
		return nil, k.endedBy
	}
	return followedProcess{k.jk}, ""
}

func (f kernelFollowed) Interrupt(ctx context.Context) error { return f.k.Interrupt(ctx) }
func (f kernelFollowed) LateWait() time.Duration             { return kernelRunner{k: f.k}.LateWait() }

// followedProcess is a kernel's process as runs.Process.
type followedProcess struct{ jk process }

func (p followedProcess) Done() <-chan struct{} { return p.jk.Done() }
func (p followedProcess) Err() error            { return p.jk.Err() }
func (p followedProcess) Forget(c runs.Call)    { p.jk.Forget(c) }

func (p followedProcess) Barrier() (runs.Call, error) {
	m, err := p.jk.NewMessage(jupyter.KernelInfoRequest, nil, nil)
	if err != nil {
		return nil, err
	}
	return p.jk.Request(Shell, m, nil, jupyter.CallOptions{IOPub: true})
}

// contextExtraOf reads what the manager kept of a context beyond
// state.Context.
func contextExtraOf(rec state.Context) contextExtra {
	var ex contextExtra
	if len(rec.Extra) > 0 {
		json.Unmarshal(rec.Extra, &ex)
	}
	return ex
}

// contextWorkspaceOf is the name of a kept context's workspace.
func contextWorkspaceOf(rec state.Context) string {
	if ex := contextExtraOf(rec); ex.Workspace != "" {
		return ex.Workspace
	}
	return contextWorkspace(rec.ID)
}

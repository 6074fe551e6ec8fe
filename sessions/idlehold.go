package sessions

import (
	"fmt"
	"time"

	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
	"kernelgate/runs"
)

// Some kernels (Deno) publish a request's execute_result after its status:
// idle. A Jupyter client takes the reply and the idle status for the end of
// a request and drops what comes later, so for an execute_request from a
// client the kernel holds that one idle status back until the request's
// execute_result or error has been delivered (such kernels publish it
// last), or until no message of the request came for the kernel's
// late-output wait.

// idleHold follows one client execute_request on a kernel that waits.
type idleHold struct {
	result bool        // its execute_result or error was delivered
	idle   *Message    // its status: idle, held back
	timer  *time.Timer // releases idle
	until  time.Time   // the hold never lasts past this
}

// maxHoldWaits bounds a hold, in late-output waits after the idle status.
const maxHoldWaits = 4

// maxLateWait bounds how far a kernel's late-output wait grows (noteLateLocked).
const maxLateWait = 250 * time.Millisecond

// idleSeen is when the status: idle of a recent request arrived.
type idleSeen struct {
	parent string
	at     time.Time
}

// noteLateLocked follows the output of a kernel that waits for late
// output: it notes when each request's idle status arrives and, when an
// execute_result or error comes longer after it than the kernel's wait,
// raises the wait to twice that delay (at most maxLateWait). A loaded
// machine delays such output, and a result that comes after its run has
// ended, or after a client was given the idle status, is lost to them:
// the next requests wait longer. It returns the raised wait, or 0.
func (k *Kernel) noteLateLocked(m *Message, now time.Time) time.Duration {
	if k.lateWait <= 0 || m.ParentID == "" {
		return 0
	}
	switch {
	case m.ExecutionState() == jupyter.StateIdle:
		k.idles[k.idleNext] = idleSeen{parent: m.ParentID, at: now}
		k.idleNext = (k.idleNext + 1) % len(k.idles)
	case m.Type() == jupyter.ExecuteResult || m.Type() == jupyter.ErrorMsg:
		for _, s := range k.idles {
			if s.parent != m.ParentID {
				continue
			}
			if d := now.Sub(s.at); d > k.lateWait && k.lateWait < maxLateWait {
				k.lateWait = min(maxLateWait, 2*d)
				return k.lateWait
			}
			return 0
		}
	}
	return 0
}

// lateOutputWait says how long output of a kernel of spec may follow its
// status: idle: metadata.kernelgate.late_output_wait (seconds, or a
// duration such as "20ms"; 0 turns it off) when the kernelspec sets it,
// else the manager's LateOutputWait for the kernels it names by
// implementation (impl, from kernel_info), else none.
func (cat *Catalog) lateOutputWait(spec *kernelspecs.Spec, impl string) (time.Duration, error) {
	md, _ := spec.Metadata["kernelgate"].(map[string]any)
	if v, ok := md["late_output_wait"]; ok {
		switch x := v.(type) {
		case float64:
			if x >= 0 && x <= 60 {
				return time.Duration(x * float64(time.Second)), nil
			}
		case string:
			if d, err := time.ParseDuration(x); err == nil && d >= 0 && d <= time.Minute {
				return d, nil
			}
		}
		return 0, fmt.Errorf("kernelspec %s: metadata.kernelgate.late_output_wait: want seconds or a duration from 0 to 1m, got %v", spec.Name, v)
	}
	if cat.cfg.LateOutputWait > 0 && contains(cat.cfg.LateOutputKernels, impl) {
		return cat.cfg.LateOutputWait, nil
	}
	return 0, nil
}

// holdIdleFor starts following a client's execute_request, before it is
// sent; it reports false when the kernel does not wait for late output,
// and when a request of that id is followed already: a repeated msg_id is
// refused when sent, and must not take the first request's hold with it.
func (k *Kernel) holdIdleFor(id string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lateWait <= 0 || k.holds[id] != nil {
		return false
	}
	if k.holds == nil {
		k.holds = map[string]*idleHold{}
	}
	if len(k.holds) >= maxClientCalls {
		// Requests the kernel never finished: forget one, holding nothing.
		for id, h := range k.holds {
			if h.idle == nil {
				delete(k.holds, id)
				break
			}
		}
	}
	k.holds[id] = &idleHold{}
	return true
}

// unholdIdle forgets a request that could not be sent.
func (k *Kernel) unholdIdle(id string) {
	k.mu.Lock()
	delete(k.holds, id)
	k.mu.Unlock()
}

// holdLocked delivers an iopub message of a followed request, holding back
// its idle status; it reports false for messages of other requests.
func (k *Kernel) holdLocked(m *Message, now time.Time) (bool, []*Client) {
	h := k.holds[m.ParentID]
	if h == nil || m.ParentID == "" {
		return false, nil
	}
	id := m.ParentID
	switch {
	case m.Type() == jupyter.ExecuteResult || m.Type() == jupyter.ErrorMsg:
		h.result = true
		slow := k.deliverLocked(runs.Outgoing{Channel: IOPub, Msg: m})
		if h.idle != nil {
			slow = append(slow, k.releaseLocked(id, h)...)
		}
		return true, slow
	case m.ExecutionState() == jupyter.StateIdle && h.idle == nil:
		if h.result {
			delete(k.holds, id)
			return true, k.deliverLocked(runs.Outgoing{Channel: IOPub, Msg: m})
		}
		h.idle = m
		h.until = now.Add(maxHoldWaits * k.lateWait)
		h.timer = time.AfterFunc(k.lateWait, func() { k.releaseIdle(id, h) })
		return true, nil
	}
	slow := k.deliverLocked(runs.Outgoing{Channel: IOPub, Msg: m})
	if h.idle != nil && now.Add(k.lateWait).Before(h.until) {
		h.timer.Reset(k.lateWait) // more output: wait for the rest
	}
	return true, slow
}

// releaseLocked delivers a held idle status and forgets its request.
func (k *Kernel) releaseLocked(id string, h *idleHold) []*Client {
	delete(k.holds, id)
	if h.timer != nil {
		h.timer.Stop()
	}
	if h.idle == nil || k.removed {
		return nil
	}
	return k.deliverLocked(runs.Outgoing{Channel: IOPub, Msg: h.idle})
}

// releaseIdle is a hold's timer: the request's output is taken to be in.
func (k *Kernel) releaseIdle(id string, h *idleHold) {
	k.mu.Lock()
	var slow []*Client
	if k.holds[id] == h {
		slow = k.releaseLocked(id, h)
	}
	k.mu.Unlock()
	cut(slow)
}

// releaseAllLocked delivers every held idle status (the process ended).
func (k *Kernel) releaseAllLocked() []*Client {
	var slow []*Client
	for id, h := range k.holds {
		slow = append(slow, k.releaseLocked(id, h)...)
	}
	return slow
}

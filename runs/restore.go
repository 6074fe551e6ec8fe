package runs

import (
	"encoding/json"
	"errors"

	"kernelgate/state"
)

// restored rebuilds a run from its record and events.
func (t *Table) restored(id string, rec Record, evs []state.Event) *Run {
	r := newRun(id, rec.Context, rec.Language, rec.Code, rec.Stdin, 0, t.cfg.Limits)
	r.created, r.deadline = rec.Created, rec.Deadline
	r.kernelID, r.msgID = rec.Kernel, rec.MsgID
	r.command = rec.Kind == RecordCommand
	r.observer = t.cfg.Observer
	r.onEnd = t.ended
	if t.cfg.Journal != nil {
		// Its record is in the store: sent again (a queued one taken
		// over by another replica), it is sent only once the record
		// naming its request is committed.
		r.ps = &runStore{j: t.cfg.Journal, stored: rec.State, recorded: true}
	}
	r.madeDurable()
	r.events, r.eventMem = nil, 0
	for i, e := range evs {
		if e.Seq != uint64(i+1) {
			break // a gap: the writes after it were lost
		}
		typ := eventType(e.Data)
		r.events = append(r.events, event{typ: typ, raw: e.Data})
		r.eventMem += len(e.Data)
		if rec.State != RunDone {
			r.b.replay(typ, e.Data)
		}
	}
	if r.ps != nil {
		r.ps.written = len(r.events)
	}
	r.state = rec.State
	if rec.State == RunQueued && rec.MsgID != "" {
		// Its code was being sent to its kernel (promise): it may run
		// there, and is picked up as a running one.
		r.state = RunRunning
	}
	switch r.state {
	case RunDone:
		r.finished = rec.Finished
		json.Unmarshal(rec.Execution, &r.b.exec)
		if rec.Failure != "" {
			r.failure = errors.New(rec.Failure)
		}
		r.kept = int64(r.eventMem)
		close(r.done)
	case RunRunning:
		r.b.started = true
	}
	return r
}

// eventType reads the type of an event's JSON.
func eventType(js []byte) string {
	var t struct {
		Type string `json:"type"`
	}
	json.Unmarshal(js, &t)
	return t.Type
}

// replay folds a kept event of a run that had not ended into its
// Execution, as the builder did when the event was made.
func (b *builder) replay(typ string, js []byte) {
	switch typ {
	case "stdout", "stderr":
		var e struct{ Text string }
		if json.Unmarshal(js, &e) == nil {
			b.headBytes += len(e.Text) // a run not ended has emitted only its head
			if typ == "stdout" {
				b.exec.Logs.Stdout = append(b.exec.Logs.Stdout, e.Text)
			} else {
				b.exec.Logs.Stderr = append(b.exec.Logs.Stderr, e.Text)
			}
		}
	case "result":
		var e struct {
			Data         map[string]json.RawMessage `json:"data"`
			Metadata     map[string]json.RawMessage `json:"metadata"`
			IsMainResult bool                       `json:"isMainResult"`
			DisplayID    string                     `json:"displayId"`
		}
		if json.Unmarshal(js, &e) == nil {
			r := newResult(e.Data, e.Metadata, e.IsMainResult, e.DisplayID)
			b.resultBytes += r.size
			b.sawMain = b.sawMain || e.IsMainResult
			b.exec.Results = append(b.exec.Results, r)
		}
	case "display_update":
		var e struct {
			DisplayID string                     `json:"displayId"`
			Data      map[string]json.RawMessage `json:"data"`
			Metadata  map[string]json.RawMessage `json:"metadata"`
		}
		if json.Unmarshal(js, &e) == nil {
			for i, r := range b.exec.Results {
				if r.DisplayID == e.DisplayID {
					next := newResult(e.Data, e.Metadata, r.IsMainResult, r.DisplayID)
					b.resultBytes += next.size - r.size
					b.exec.Results[i] = next
				}
			}
		}
	case "clear_output":
		var e struct{ Wait bool }
		if json.Unmarshal(js, &e) == nil {
			if e.Wait {
				b.clearPending = true
			} else {
				b.clearPending = false
				b.clear()
			}
		}
	case "error":
		var e ExecError
		if json.Unmarshal(js, &e) == nil && b.exec.Error == nil {
			b.exec.Error = &e
		}
	}
}

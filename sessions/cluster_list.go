package sessions

import (
	"sort"

	"kernelgate/state"

	"kernelgate/internal/timefmt"
)

// The models of what another replica owns, as the store records it: a
// listing shows them for a replica that did not answer for itself in
// time. What only the owner knows live is shown as what the record
// says: the last activity as last written (checkpointed), no
// connections, and "unknown" for the execution state.

// StoredState is the execution state of a kernel or context listed from
// its record: only its owner knows it live.
const StoredState = "unknown"

// StoredKernelModel is the model of a kernel's record, owned by the
// replica at replica ("" when none holds its lease).
func StoredKernelModel(rec state.Kernel, replica string) KernelModel {
	last := rec.LastActivity
	if last.IsZero() {
		last = rec.Created
	}
	return KernelModel{ID: rec.ID, Name: rec.Spec, LastActivity: timefmt.Format(last), ExecutionState: StoredState, Replica: replica}
}

// StoredContextModel is the model of a context's record, its kernel
// owned by the replica at replica ("" when none holds its lease), kernel
// its kernel's record when there is one.
func (m *Manager) StoredContextModel(rec state.Context, kernel *state.Kernel, replica string) ContextModel {
	spec := contextExtraOf(rec).Kernelspec
	if spec == "" {
		spec = m.cfg.Languages[rec.Language]
	}
	names := make([]string, 0, len(rec.Env))
	for n := range rec.Env {
		names = append(names, n)
	}
	sort.Strings(names)
	cm := ContextModel{ID: rec.ID, Language: rec.Language, Kernelspec: spec, Cwd: rec.Cwd, Env: names, ProcessIDs: []string{},
		ExecutionState: "dead", CreatedAt: timefmt.Format(rec.Created), LastActivity: timefmt.Format(rec.Created), Replica: replica}
	if rec.KernelID != "" {
		id := rec.KernelID
		cm.KernelID = &id
		if kernel != nil && replica != "" {
			km := StoredKernelModel(*kernel, replica)
			cm.Active, cm.ExecutionState, cm.LastActivity = true, km.ExecutionState, km.LastActivity
		}
	}
	return cm
}

// StoredSessionModel is the model of a Jupyter session's record, its
// kernel's record being kernel, owned by the replica at replica.
func StoredSessionModel(rec state.Session, kernel state.Kernel, replica string) SessionModel {
	km := StoredKernelModel(kernel, replica)
	sm := SessionModel{ID: rec.ID, Path: rec.Path, Name: rec.Name, Type: rec.Type, Kernel: &km}
	if rec.Type == "notebook" {
		sm.Notebook = &NotebookModel{Path: rec.Path, Name: rec.Name}
	}
	return sm
}

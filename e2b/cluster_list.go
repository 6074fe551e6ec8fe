package e2b

import (
	"kernelgate/sessions"
	"kernelgate/state"

	"kernelgate/internal/timefmt"
)

// StoredModel is the listing's model of a sandbox from its record, as
// sandboxModel shows a sandbox this process serves: for a listing among
// replicas of a sandbox whose owner did not answer.
func StoredModel(mgr *sessions.Manager, rec state.Sandbox) map[string]any {
	res, _ := mgr.Catalog().Resources("python")
	template := rec.Template
	if template == "" {
		template = "code-interpreter-v1"
	}
	return map[string]any{
		"sandboxID": rec.ID, "templateID": template, "alias": template, "clientID": "kernelgate",
		"envdVersion": envdVersion, "startedAt": timefmt.Format(rec.Started), "endAt": timefmt.Format(rec.Ends),
		"state": "running", "cpuCount": res.CPUs, "memoryMB": res.MemoryBytes >> 20, "diskSizeMB": 0, "metadata": nonNil(rec.Metadata),
	}
}

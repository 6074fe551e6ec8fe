package sessions

import (
	"kernelgate/kernelspecs"
	"kernelgate/workspace"
)

// Catalog is what kernels the manager offers: the kernelspecs, the
// languages of the code-interpreter API and the kernelspec each runs on,
// and what a kernel of each gets (limits, sandbox, the variables a request
// may set, how late its output may come). It holds no kernel.
type Catalog struct {
	cfg    *Config
	specs  *kernelspecs.Catalog
	wsRoot *workspace.Root // the workspaces' root a sandbox hides, or nil
}

// Catalog is the manager's catalog of kernelspecs and languages.
func (m *Manager) Catalog() *Catalog { return m.catalog }

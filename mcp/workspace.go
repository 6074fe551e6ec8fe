package mcp

import (
	"context"
	"fmt"
	"io"

	"kernelgate/sessions"
	"kernelgate/workspace"
)

// workspaceFiles serves the file tools from the contexts' workspaces.
type workspaceFiles struct {
	mgr       *sessions.Manager
	maxUpload int64
}

var _ Files = workspaceFiles{}

// WorkspaceFiles serves the file tools from the workspace of each context
// of mgr; a write over maxUpload bytes fails (0: no limit).
func WorkspaceFiles(mgr *sessions.Manager, maxUpload int64) Files {
	return workspaceFiles{mgr: mgr, maxUpload: maxUpload}
}

func (f workspaceFiles) workspace(id string) (*workspace.Workspace, error) {
	c, err := f.mgr.Context(id)
	if err != nil {
		return nil, err
	}
	ws := c.Workspace()
	if ws == nil {
		return nil, fmt.Errorf("%w: context %s has no workspace", sessions.ErrNoSuchContext, id)
	}
	return ws, nil
}

func infoOf(e workspace.Entry) FileInfo {
	return FileInfo{Name: e.Name, Path: e.Path, Type: e.Type, Size: e.Size, Modified: e.Modified.UTC()}
}

func (f workspaceFiles) Write(_ context.Context, id, p string, r io.Reader) (FileInfo, error) {
	ws, err := f.workspace(id)
	if err != nil {
		return FileInfo{}, err
	}
	e, err := ws.Write(p, r, f.maxUpload)
	return infoOf(e), err
}

func (f workspaceFiles) Read(_ context.Context, id, p string, max int64) ([]byte, FileInfo, error) {
	ws, err := f.workspace(id)
	if err != nil {
		return nil, FileInfo{}, err
	}
	file, e, err := ws.Open(p)
	if err != nil {
		return nil, FileInfo{}, err
	}
	defer file.Close()
	if e.Size > max {
		return nil, FileInfo{}, fmt.Errorf("%w: %s has %d bytes, over the %d read_file returns", workspace.ErrTooLarge, p, e.Size, max)
	}
	data, err := io.ReadAll(io.LimitReader(file, max+1))
	if err != nil {
		return nil, FileInfo{}, err
	}
	if int64(len(data)) > max {
		return nil, FileInfo{}, fmt.Errorf("%w: %s grew past the %d bytes read_file returns", workspace.ErrTooLarge, p, max)
	}
	return data, infoOf(e), nil
}

func (f workspaceFiles) List(_ context.Context, id, p string) ([]FileInfo, error) {
	ws, err := f.workspace(id)
	if err != nil {
		return nil, err
	}
	entries, err := ws.List(p, false)
	if err != nil {
		return nil, err
	}
	out := make([]FileInfo, 0, len(entries))
	for _, e := range entries {
		out = append(out, infoOf(e))
	}
	return out, nil
}

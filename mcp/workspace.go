package mcp

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strings"

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

func (f workspaceFiles) Open(_ context.Context, id, p string, max int64) (io.ReadSeekCloser, FileInfo, error) {
	ws, err := f.workspace(id)
	if err != nil {
		return nil, FileInfo{}, err
	}
	file, e, err := ws.Open(p)
	if err != nil {
		return nil, FileInfo{}, err
	}
	if e.Size > max {
		file.Close()
		return nil, FileInfo{}, fmt.Errorf("%w: %s has %d bytes, over the %d read_file returns: download it from the files API (GET /api/contexts/%s/files/%s), or read a part of it with run_code",
			workspace.ErrTooLarge, e.Path, e.Size, max, url.PathEscape(id), escapePath(e.Path))
	}
	return file, infoOf(e), nil
}

// escapePath escapes each element of a workspace path for a URL.
func escapePath(p string) string {
	parts := strings.Split(p, "/")
	for i, el := range parts {
		parts[i] = url.PathEscape(el)
	}
	return strings.Join(parts, "/")
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

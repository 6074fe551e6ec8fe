package e2b

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"

	"kernelgate/internal/timefmt"
	"kernelgate/workspace"
)

// This file is a sandbox's envd as far as the SDK's files module uses it:
// GET and POST /files (download, multipart or octet-stream upload), and
// the Connect RPCs of filesystem.Filesystem (ListDir, Stat, MakeDir,
// Remove) in Connect's JSON encoding. Everything happens in the sandbox's
// workspace, through the workspace package's checks.

// home is the folder E2B's sandboxes work in; absolute paths below it
// name the workspace's files, other absolute paths are refused.
const home = "/home/user"

// relPath maps a path the SDK sends onto the workspace: relative ones are
// relative to it, /home/user/... is below it.
func relPath(p string) (string, error) {
	switch {
	case p == home || p == home+"/":
		return "", nil
	case strings.HasPrefix(p, home+"/"):
		p = strings.TrimPrefix(p, home+"/")
	case strings.HasPrefix(p, "/"):
		return "", fmt.Errorf("%w: %s is outside the sandbox's workspace (%s)", workspace.ErrBadPath, p, home)
	}
	if _, err := workspace.CleanPath(p); err != nil {
		return "", err
	}
	return p, nil
}

// absPath is a workspace path as the SDK sees it.
func absPath(rel string) string {
	if rel == "" || rel == "." {
		return home
	}
	return home + "/" + rel
}

// envdEntry is a file or folder as envd's JSON shows it.
type envdEntry struct {
	Name         string `json:"name"`
	Type         string `json:"type"`
	Path         string `json:"path"`
	Size         string `json:"size,omitempty"`
	Mode         uint32 `json:"mode,omitempty"`
	Permissions  string `json:"permissions,omitempty"`
	Owner        string `json:"owner,omitempty"`
	Group        string `json:"group,omitempty"`
	ModifiedTime string `json:"modifiedTime,omitempty"`
}

// rpcEntry is an entry in the Connect (protobuf JSON) encoding.
func rpcEntry(e workspace.Entry) envdEntry {
	typ, mode, perm := "FILE_TYPE_FILE", uint32(0o644), "-rw-r--r--"
	switch e.Type {
	case "dir":
		typ, mode, perm = "FILE_TYPE_DIRECTORY", 0o755, "drwxr-xr-x"
	case "symlink":
		typ, mode, perm = "FILE_TYPE_SYMLINK", 0o777, "lrwxrwxrwx"
	case "fifo", "socket", "device", "other":
		// Not a file the sandbox's file API reads: envd's protocol has no
		// type for it, and the SDK leaves an unspecified type undefined.
		typ, perm = "FILE_TYPE_UNSPECIFIED", specialPerm[e.Type]
	}
	name := e.Name
	if e.Path == "" {
		name = "user"
	}
	return envdEntry{Name: name, Type: typ, Path: absPath(e.Path), Size: strconv.FormatInt(e.Size, 10), Mode: mode,
		Permissions: perm, Owner: "user", Group: "user", ModifiedTime: timefmt.Format(e.Modified)}
}

// specialPerm is the permission string `ls -l` would show for a special
// file's type.
var specialPerm = map[string]string{"fifo": "prw-r--r--", "socket": "srw-r--r--", "device": "crw-r--r--", "other": "?rw-r--r--"}

// envdError writes an error of envd's HTTP API.
func (h *Handler) envdError(w http.ResponseWriter, err error) {
	status, msg := h.fileStatus(err)
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

// fileStatus is the status of a file operation's error.
func (h *Handler) fileStatus(err error) (int, string) {
	switch {
	case errors.Is(err, workspace.ErrNotFound):
		return http.StatusNotFound, err.Error()
	case errors.Is(err, workspace.ErrBadPath), errors.Is(err, workspace.ErrEscapes),
		errors.Is(err, workspace.ErrIsDir), errors.Is(err, workspace.ErrNotDir), errors.Is(err, workspace.ErrTooMany):
		return http.StatusBadRequest, err.Error()
	case errors.Is(err, workspace.ErrTooLarge):
		return http.StatusRequestEntityTooLarge, err.Error()
	case errors.Is(err, workspace.ErrClosed):
		return http.StatusBadGateway, "the sandbox was killed"
	}
	return h.cfg.Describe(err)
}

// getFile is the SDK's files.read.
func (h *Handler) getFile(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	rel, err := relPath(r.URL.Query().Get("path"))
	if err != nil {
		h.envdError(w, err)
		return
	}
	f, e, err := sb.ws.Open(rel)
	if err != nil {
		h.envdError(w, err)
		return
	}
	defer f.Close()
	typ := mime.TypeByExtension(pathExt(rel))
	if typ == "" {
		typ = "application/octet-stream"
	}
	w.Header().Set("Content-Type", typ)
	w.Header().Set("Content-Length", strconv.FormatInt(e.Size, 10))
	w.WriteHeader(http.StatusOK)
	// The file as it was opened, handed to w's ReadFrom: net/http's has
	// the kernel send it (sendfile); a file grown since is not sent past
	// its Content-Length.
	io.CopyN(w, f, e.Size)
}

func pathExt(p string) string {
	if i := strings.LastIndexByte(p, '.'); i > strings.LastIndexByte(p, '/') {
		return p[i:]
	}
	return ""
}

// writeEntry is an uploaded file as envd answers.
type writeEntry struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// postFile is the SDK's files.write: a multipart form with a "file" part
// per file, or the bytes themselves as application/octet-stream. A part
// is written at the path of the query when there is one (one file), else
// at its file name, which the SDK sets to the file's whole path.
func (h *Handler) postFile(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	qpath := r.URL.Query().Get("path")
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []writeEntry
	written := map[string]bool{}
	write := func(p string, body io.Reader) error {
		rel, err := relPath(p)
		if err != nil {
			return err
		}
		clean, err := workspace.CleanPath(rel)
		if err != nil {
			return err
		}
		if written[clean] {
			return fmt.Errorf("%w: %s is written twice in one upload (the first is kept)", workspace.ErrBadPath, absPath(clean))
		}
		e, err := sb.ws.Write(rel, body, h.cfg.MaxUploadBytes)
		if err != nil {
			return err
		}
		written[clean] = true
		out = append(out, writeEntry{Name: e.Name, Type: "file", Path: absPath(e.Path)})
		return nil
	}
	// fail answers an error; the files written before it stay, and the
	// message names them.
	fail := func(err error) {
		if len(out) > 0 {
			names := make([]string, len(out))
			for i, e := range out {
				names[i] = e.Path
			}
			err = fmt.Errorf("%w (written before it: %s)", err, strings.Join(names, ", "))
		}
		h.envdError(w, err)
	}
	switch ct {
	case "multipart/form-data":
		mr, err := r.MultipartReader()
		if err != nil || params["boundary"] == "" {
			h.envdError(w, fmt.Errorf("%w: a multipart body without a boundary", workspace.ErrBadPath))
			return
		}
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				fail(fmt.Errorf("%w: multipart body: %v", workspace.ErrBadPath, err))
				return
			}
			name, filename, err := partNames(part)
			if err == nil && name == "file" {
				p := qpath
				if p == "" {
					p = filename
				}
				err = write(p, part)
			}
			part.Close()
			if err != nil {
				fail(err)
				return
			}
		}
	default:
		if r.Header.Get("Content-Encoding") != "" {
			writeJSON(w, http.StatusBadRequest, map[string]any{"code": 400, "message": "compressed uploads are not supported"})
			return
		}
		if err := write(qpath, r.Body); err != nil {
			h.envdError(w, err)
			return
		}
	}
	if len(out) == 0 {
		writeJSON(w, http.StatusBadRequest, map[string]any{"code": 400, "message": "no file in the body"})
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// partNames returns the form name and the whole file name of a multipart
// part: Part.FileName keeps only the last element of a path.
func partNames(part *multipart.Part) (name, filename string, err error) {
	cd := part.Header.Get("Content-Disposition")
	disposition, params, err := mime.ParseMediaType(cd)
	if err != nil || disposition != "form-data" {
		return "", "", fmt.Errorf("%w: a part's Content-Disposition %q is not form-data with a name", workspace.ErrBadPath, cd)
	}
	return params["name"], params["filename"], nil
}

// rpcError writes a Connect error.
func rpcError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]string{"code": code, "message": msg})
}

// fileRPCError writes a file operation's error as a Connect error.
func (h *Handler) fileRPCError(w http.ResponseWriter, err error) {
	status, msg := h.fileStatus(err)
	code := "internal"
	switch status {
	case http.StatusNotFound:
		code = "not_found"
	case http.StatusBadRequest:
		code = "invalid_argument"
	case http.StatusRequestEntityTooLarge:
		code = "resource_exhausted"
	case http.StatusBadGateway:
		code, status = "unavailable", http.StatusServiceUnavailable
	}
	rpcError(w, status, code, msg)
}

// filesystemRPC serves the unary Connect RPCs of filesystem.Filesystem.
func (h *Handler) filesystemRPC(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	if r.Method != http.MethodPost {
		rpcError(w, http.StatusMethodNotAllowed, "unimplemented", "Connect RPCs are POSTs")
		return
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		rpcError(w, http.StatusUnsupportedMediaType, "unimplemented", "only Connect's JSON encoding is served")
		return
	}
	var req struct {
		Path        string `json:"path"`
		Depth       int    `json:"depth"`
		Source      string `json:"source"`
		Destination string `json:"destination"`
	}
	if err := h.decode(r, &req); err != nil {
		rpcError(w, http.StatusBadRequest, "invalid_argument", "body: "+err.Error())
		return
	}
	method := r.PathValue("method")
	if method == "Move" {
		rpcError(w, http.StatusNotImplemented, "unimplemented", "rename is not supported: read and write the file, then remove the old one")
		return
	}
	rel, err := relPath(req.Path)
	if err != nil {
		h.fileRPCError(w, err)
		return
	}
	switch method {
	case "Stat":
		e, err := sb.ws.Stat(rel)
		if err != nil {
			h.fileRPCError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"entry": rpcEntry(e)})
	case "ListDir":
		depth := max(req.Depth, 1)
		entries, err := sb.ws.List(rel, depth > 1)
		if err != nil {
			h.fileRPCError(w, err)
			return
		}
		base := strings.Count(strings.Trim(rel, "/"), "/") + 1
		if rel == "" {
			base = 0
		}
		out := []envdEntry{}
		for _, e := range entries {
			if strings.Count(e.Path, "/")+1-base <= depth {
				out = append(out, rpcEntry(e))
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"entries": out})
	case "MakeDir":
		if sb.ws.Exists(rel) {
			rpcError(w, http.StatusConflict, "already_exists", absPath(rel)+" exists")
			return
		}
		e, err := sb.ws.Mkdir(rel)
		if err != nil {
			h.fileRPCError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"entry": rpcEntry(e)})
	case "Remove":
		if rel == "" {
			h.fileRPCError(w, fmt.Errorf("%w: the workspace itself cannot be removed", workspace.ErrBadPath))
			return
		}
		if err := sb.ws.Remove(rel, true); err != nil {
			h.fileRPCError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{})
	default:
		rpcError(w, http.StatusNotImplemented, "unimplemented", "filesystem."+method+" is not served: files are read, written, listed, stat'ed, made and removed")
	}
}

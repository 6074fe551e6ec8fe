package gateway

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"kernelgate/internal/timefmt"
	"kernelgate/workspace"
)

// The files of a context: PUT, GET and DELETE /api/contexts/{id}/files/{path}
// and the listing GET /api/contexts/{id}/files?path=&recursive=. Paths
// are relative to the context's workspace; every check of them is the
// workspace package's, which this file only feeds.

// fileModel is a file as the API shows it.
type fileModel struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	Type     string `json:"type"`
	Size     int64  `json:"size"`
	Modified string `json:"modified"`
}

func newFileModel(e workspace.Entry) fileModel {
	return fileModel{Name: e.Name, Path: e.Path, Type: e.Type, Size: e.Size, Modified: timefmt.Format(e.Modified)}
}

// contextWorkspace returns the workspace of the route's context, checking
// a context token against it.
func (s *Server) contextWorkspace(c echo.Context) (*workspace.Workspace, error) {
	id := c.Param("id")
	if err := s.checkContext(c, id); err != nil {
		return nil, err
	}
	ctx, err := s.mgr.Context(id)
	if err != nil {
		return nil, err
	}
	ws := ctx.Workspace()
	if ws == nil {
		return nil, newError(http.StatusNotFound, "SESSION_NOT_FOUND", "context "+id+" has no workspace")
	}
	return ws, nil
}

// filePath is the {path} of a files route, unescaped. An escaped "/"
// (%2f) would let one path element name two, and NUL end it: refused. A
// backslash (%5c) is the workspace's escape of a byte that is not UTF-8
// (\xHH), which the workspace decodes and checks.
func (s *Server) filePath(c echo.Context) (string, error) {
	raw := c.Request().URL.EscapedPath()
	prefix := s.path("api/contexts/" + url.PathEscape(c.Param("id")) + "/files/")
	rest, ok := strings.CutPrefix(raw, prefix)
	if !ok {
		rest = c.Param("*")
	}
	lower := strings.ToLower(rest)
	for _, bad := range []string{"%2f", "%00"} {
		if strings.Contains(lower, bad) {
			return "", newError(http.StatusBadRequest, "BAD_REQUEST", "an encoded separator (%2F) or NUL is not allowed in a file path")
		}
	}
	p, err := url.PathUnescape(rest)
	if err != nil {
		return "", newError(http.StatusBadRequest, "BAD_REQUEST", "the file path is not validly escaped")
	}
	if _, err := workspace.CleanPath(p); err != nil {
		return "", err
	}
	return p, nil
}

func (s *Server) putFile(c echo.Context) error {
	ws, err := s.contextWorkspace(c)
	if err != nil {
		return err
	}
	p, err := s.filePath(c)
	if err != nil {
		return err
	}
	r := c.Request()
	if r.ContentLength > s.cfg.MaxUploadBytes {
		return newError(http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", fmt.Sprintf("the file is over the upload limit of %d bytes (--max-upload)", s.cfg.MaxUploadBytes))
	}
	// A large file takes its time: the body may take as long as it keeps
	// coming, but not stall.
	body := &stallLimit{r: r.Body, rc: http.NewResponseController(c.Response())}
	e, err := ws.Write(p, body, s.cfg.MaxUploadBytes)
	if err != nil {
		if errors.Is(err, workspace.ErrTooLarge) {
			return newError(http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", fmt.Sprintf("the file is over the upload limit of %d bytes (--max-upload)", s.cfg.MaxUploadBytes))
		}
		return err
	}
	return c.JSON(http.StatusCreated, map[string]any{"path": e.Path, "size": e.Size, "modified": timefmt.Format(e.Modified)})
}

func (s *Server) getFile(c echo.Context) error {
	ws, err := s.contextWorkspace(c)
	if err != nil {
		return err
	}
	p, err := s.filePath(c)
	if err != nil {
		return err
	}
	f, e, err := ws.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	h := c.Response().Header()
	// A page uploaded into a workspace must not run as the gateway's own.
	h.Set("Content-Security-Policy", "sandbox")
	h.Set("Content-Disposition", "attachment; filename*=UTF-8''"+url.PathEscape(e.Name))
	// ServeContent sets Content-Type from the name (sniffed when the name
	// says nothing), Content-Length, and answers Range and conditional
	// requests.
	http.ServeContent(download{c.Response()}, c.Request(), e.Name, e.Modified, f)
	return nil
}

// download hands the file of a download to net/http's own ReadFrom, which
// has the kernel send it from the page cache (sendfile) once the headers
// are out; anything else (the parts of a multi-range answer) goes to the
// connection in large writes (see workspace.CopyTo) rather than the
// 32 KiB ones of io.Copy.
type download struct{ *echo.Response }

func (w download) ReadFrom(src io.Reader) (int64, error) {
	if rf, ok := w.Writer.(io.ReaderFrom); ok && w.Committed && isFile(src) {
		n, err := rf.ReadFrom(src)
		w.Size += n
		return n, err
	}
	return workspace.CopyTo(w.Response, src)
}

// isFile reports whether r is an *os.File, alone or behind the
// io.LimitedReader http.ServeContent puts around it.
func isFile(r io.Reader) bool {
	if lr, ok := r.(*io.LimitedReader); ok {
		r = lr.R
	}
	_, ok := r.(*os.File)
	return ok
}

func (s *Server) listFiles(c echo.Context) error {
	ws, err := s.contextWorkspace(c)
	if err != nil {
		return err
	}
	recursive, err := boolQuery(c, "recursive")
	if err != nil {
		return err
	}
	entries, err := ws.List(c.QueryParam("path"), recursive)
	if err != nil {
		return err
	}
	out := make([]fileModel, len(entries))
	for i, e := range entries {
		out[i] = newFileModel(e)
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) deleteFile(c echo.Context) error {
	ws, err := s.contextWorkspace(c)
	if err != nil {
		return err
	}
	p, err := s.filePath(c)
	if err != nil {
		return err
	}
	recursive, err := boolQuery(c, "recursive")
	if err != nil {
		return err
	}
	if err := ws.Remove(p, recursive); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// boolQuery reads a true/false query parameter (absent: false).
func boolQuery(c echo.Context, name string) (bool, error) {
	v := c.QueryParam(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, newError(http.StatusBadRequest, "BAD_REQUEST", name+" is true or false")
	}
	return b, nil
}

func (s *Server) listLanguages(c echo.Context) error {
	return c.JSON(http.StatusOK, s.mgr.LanguageInfos())
}

// uploadStall is how long an upload may send nothing before it is cut.
const uploadStall = 60 * time.Second

// stallLimit moves the connection's read deadline forward before each
// read: a body is read as long as it flows.
type stallLimit struct {
	r  io.Reader
	rc *http.ResponseController
}

func (s *stallLimit) Read(p []byte) (int, error) {
	s.rc.SetReadDeadline(time.Now().Add(uploadStall))
	return s.r.Read(p)
}

package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"kernelgate/kernelspecs"
	"kernelgate/sessions"
)

func (s *Server) getAPI(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"version": Version, "kernelgate": s.cfg.ProductVersion})
}

func (s *Server) getStatus(c echo.Context) error {
	return c.JSON(http.StatusOK, s.mgr.Status())
}

// kernelspecModel is a kernelspec as jupyter_server shows it.
type kernelspecModel struct {
	Name      string            `json:"name"`
	Spec      specBody          `json:"spec"`
	Resources map[string]string `json:"resources"`
}

type specBody struct {
	Argv            []string          `json:"argv"`
	Env             map[string]string `json:"env"`
	DisplayName     string            `json:"display_name"`
	Language        string            `json:"language"`
	InterruptMode   string            `json:"interrupt_mode"`
	Metadata        map[string]any    `json:"metadata"`
	ProtocolVersion string            `json:"kernel_protocol_version,omitempty"`
}

func (s *Server) specModel(sp *kernelspecs.Spec) kernelspecModel {
	res := make(map[string]string, len(sp.Resources))
	for key, file := range sp.Resources {
		res[key] = s.path("kernelspecs/" + sp.Name + "/" + file)
	}
	argv := sp.Argv
	if argv == nil {
		argv = []string{}
	}
	env := sp.Env
	if env == nil {
		env = map[string]string{}
	}
	md := sp.Metadata
	if md == nil {
		md = map[string]any{}
	}
	return kernelspecModel{
		Name: sp.Name,
		Spec: specBody{Argv: argv, Env: env, DisplayName: sp.DisplayName, Language: sp.Language,
			InterruptMode: string(sp.InterruptMode), Metadata: md, ProtocolVersion: sp.ProtocolVersion},
		Resources: res,
	}
}

func (s *Server) listKernelspecs(c echo.Context) error {
	specs := map[string]kernelspecModel{}
	for _, sp := range s.mgr.Specs().All() {
		specs[sp.Name] = s.specModel(sp)
	}
	return c.JSON(http.StatusOK, map[string]any{"default": s.mgr.DefaultKernel(), "kernelspecs": specs})
}

func (s *Server) getKernelspec(c echo.Context) error {
	sp, err := s.mgr.Specs().Get(c.Param("name"))
	if err != nil {
		return newError(http.StatusNotFound, "NOT_FOUND", "Kernel spec "+c.Param("name")+" not found")
	}
	return c.JSON(http.StatusOK, s.specModel(sp))
}

func (s *Server) getKernelspecResource(c echo.Context) error {
	notFound := newError(http.StatusNotFound, "NOT_FOUND", "no such kernelspec resource")
	sp, err := s.mgr.Specs().Get(c.Param("name"))
	if err != nil {
		return notFound
	}
	file, err := sp.ResourcePath(c.Param("*"))
	if err != nil {
		return notFound
	}
	if strings.HasSuffix(file, ".png") || strings.HasSuffix(file, ".svg") {
		c.Response().Header().Set("Cache-Control", "max-age=2592000")
	}
	return c.File(file)
}

// readJSON decodes a JSON body into v; an empty body leaves v as is.
func (s *Server) readJSON(c echo.Context, v any) error {
	r := c.Request()
	// A body sent slowly gets no more time than a fast one would need.
	http.NewResponseController(c.Response()).SetReadDeadline(time.Now().Add(bodyReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return newError(http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", "the request body is over the limit")
		}
		return newError(http.StatusBadRequest, "BAD_REQUEST", "reading the request body: "+err.Error())
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		json := err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
		// @jupyterlab/services posts JSON as text/plain (fetch's default);
		// form bodies, which a page of another origin can send, never pass.
		if sf, _ := c.Get(surfaceKey).(surface); sf == jupyterSurface && mt == "text/plain" {
			json = true
		}
		if !json {
			return newError(http.StatusUnsupportedMediaType, "UNSUPPORTED_MEDIA_TYPE", "the body must be JSON: send Content-Type: application/json")
		}
	}
	if err := json.Unmarshal(body, v); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			return newError(http.StatusBadRequest, "BAD_REQUEST", fmt.Sprintf("field %s: want %s, not %s", typeErr.Field, jsonKind(typeErr.Type), typeErr.Value))
		}
		var syntaxErr *json.SyntaxError
		if errors.As(err, &syntaxErr) {
			return newError(http.StatusBadRequest, "BAD_REQUEST", fmt.Sprintf("the request body is not valid JSON (at byte %d)", syntaxErr.Offset))
		}
		return newError(http.StatusBadRequest, "BAD_REQUEST", "the request body is not a valid JSON object")
	}
	return nil
}

// bodyReadTimeout bounds reading a request body.
const bodyReadTimeout = 60 * time.Second

// jsonKind names a Go type as a JSON kind, for error messages.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64, reflect.Float64, reflect.Float32, reflect.Uint64:
		return "a number"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "another type"
}

// envStrings converts a JSON env object, refusing non-string values.
func envStrings(raw map[string]any) (map[string]string, error) {
	env := make(map[string]string, len(raw))
	for k, v := range raw {
		s, ok := v.(string)
		if !ok {
			return nil, newError(http.StatusBadRequest, "BAD_REQUEST", "env "+k+": values must be strings")
		}
		env[k] = s
	}
	return env, nil
}

func (s *Server) listKernels(c echo.Context) error {
	ks := s.mgr.Kernels()
	out := make([]sessions.KernelModel, 0, len(ks))
	for _, k := range ks {
		out = append(out, k.Model())
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) startKernel(c echo.Context) error {
	var body struct {
		Name     string         `json:"name"`
		KernelID string         `json:"kernel_id"`
		Path     string         `json:"path"`
		Env      map[string]any `json:"env"`
	}
	if err := s.readJSON(c, &body); err != nil {
		return err
	}
	env, err := envStrings(body.Env)
	if err != nil {
		return err
	}
	k, err := s.mgr.StartKernel(c.Request().Context(), sessions.StartOptions{Name: body.Name, ID: body.KernelID, Env: env})
	if err != nil {
		return badSpec(err)
	}
	c.Response().Header().Set("Location", s.path("api/kernels/"+k.ID()))
	return c.JSON(http.StatusCreated, k.Model())
}

func (s *Server) kernel(c echo.Context) (*sessions.Kernel, error) {
	return s.mgr.Kernel(c.Param("id"))
}

func (s *Server) getKernel(c echo.Context) error {
	k, err := s.kernel(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, k.Model())
}

func (s *Server) deleteKernel(c echo.Context) error {
	if err := s.mgr.ShutdownKernel(c.Request().Context(), c.Param("id")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) interruptKernel(c echo.Context) error {
	k, err := s.kernel(c)
	if err != nil {
		return err
	}
	if err := k.Interrupt(c.Request().Context()); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) restartKernel(c echo.Context) error {
	k, err := s.kernel(c)
	if err != nil {
		return err
	}
	if err := k.Restart(c.Request().Context()); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, k.Model())
}

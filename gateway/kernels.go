package gateway

import (
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"kernelgate/kernelspecs"
	"kernelgate/sessions"
)

func (s *Server) getAPI(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"version": Version, "kernelgate": s.cfg.ProductVersion})
}

func (s *Server) getStatus(c echo.Context) error {
	if s.clustered(c) {
		return s.clusterStatus(c)
	}
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
	for _, sp := range s.mgr.Catalog().Specs().All() {
		specs[sp.Name] = s.specModel(sp)
	}
	return c.JSON(http.StatusOK, map[string]any{"default": s.mgr.Catalog().DefaultKernel(), "kernelspecs": specs})
}

func (s *Server) getKernelspec(c echo.Context) error {
	sp, err := s.mgr.Catalog().Specs().Get(c.Param("name"))
	if err != nil {
		return newError(http.StatusNotFound, "NOT_FOUND", "Kernel spec "+c.Param("name")+" not found")
	}
	return c.JSON(http.StatusOK, s.specModel(sp))
}

func (s *Server) getKernelspecResource(c echo.Context) error {
	notFound := newError(http.StatusNotFound, "NOT_FOUND", "no such kernelspec resource")
	sp, err := s.mgr.Catalog().Specs().Get(c.Param("name"))
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
	if s.clustered(c) {
		return s.listClusterKernels(c)
	}
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

package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
	"kernelgate/workspace"
)

// This file is where a context's kernel works: its workspace (a folder
// under the workspace root, the kernel's working directory, kept across
// kernel restarts and deleted with the context) and the packages installed
// into it.
//
// Layout of a workspace, whose name in the root is contexts/<id> for a
// context and runs/<id> for an isolated run:
//
//	<workspace>/             the kernel's cwd (or a folder below, cwd on create)
//	<workspace>/.local/      Python packages: pip's user scheme (PYTHONUSERBASE)
//	<workspace>/.cache/deno/ Deno's cache of npm: and jsr: imports (DENO_DIR)
//
// Python packages are not on sys.path when the interpreter starts: Python
// would then run the .pth files and usercustomize found there at every
// start, and a file a cell planted would run in every later kernel of the
// context. The kernel adds the folder once it runs (packageCode), and pip,
// run from the kernel (%pip, !pip, or the packages of a create), installs
// there with --user: Debian's packages stay visible and untouched.

// workDir is where a kernel works.
type workDir struct {
	ws  *workspace.Workspace // nil: a kernel of the Jupyter surface
	cwd string               // absolute; inside ws when ws is set
}

// Workspace is the context's workspace.
func (c *Context) Workspace() *workspace.Workspace { return c.ws }

// Workspaces is the root of the contexts' workspaces.
func (m *Manager) Workspaces() *workspace.Root { return m.wsRoot }

// openWorkspaces opens the root of workspaces, a temporary one when none
// is configured.
func (m *Manager) openWorkspaces() {
	if m.cfg.Workspaces != nil {
		m.wsRoot = m.cfg.Workspaces
		return
	}
	r, err := workspace.TempRoot()
	if err != nil {
		m.log.Error("no workspace root: contexts cannot be created", "err", err)
		return
	}
	m.wsRoot, m.wsOwned = r, true
}

// closeWorkspaces removes a temporary root.
func (m *Manager) closeWorkspaces() {
	if m.wsOwned && m.wsRoot != nil {
		if err := m.wsRoot.Close(); err != nil {
			m.log.Warn("temporary workspace root not removed", "dir", m.wsRoot.Dir(), "err", err)
		}
	}
}

// newWorkspace makes (or reopens) the workspace name for kernels of spec,
// given to the sandbox user those kernels run as.
func (m *Manager) newWorkspace(name string, spec *kernelspecs.Spec) (*workspace.Workspace, error) {
	if m.wsRoot == nil {
		return nil, errorf(ErrKernelStart, "no workspace root: see the gateway's log")
	}
	var owner *workspace.Owner
	_, sb, err := m.catalog.isolation(spec)
	if err != nil {
		return nil, errorf(ErrKernelStart, "%v", err)
	}
	if sb != nil {
		uid, gid, switched, err := sb.HostUser()
		if err != nil {
			return nil, errorf(ErrKernelStart, "sandbox: %v", err)
		}
		if switched {
			owner = &workspace.Owner{UID: uid, GID: gid}
		}
	}
	ws, err := m.wsRoot.Create(name, owner)
	if err != nil {
		return nil, errorf(ErrKernelStart, "workspace: %v", err)
	}
	return ws, nil
}

// CreateWorkspace makes (or reopens) the workspace name (a relative path
// under the root, e.g. "sandboxes/<id>") for kernels of language, given
// to the user those kernels run as; contexts share it through
// ContextRequest.Workspace. The caller deletes it (Workspace.Delete) when
// it is done with it. The names "contexts/…" and "runs/…" are the
// manager's own.
func (m *Manager) CreateWorkspace(name, language string) (*workspace.Workspace, error) {
	if strings.HasPrefix(name, "contexts/") || strings.HasPrefix(name, "runs/") {
		return nil, errorf(ErrBadRequest, "workspace names below contexts/ and runs/ are the gateway's own")
	}
	spec, err := m.catalog.languageSpec(language)
	if err != nil {
		return nil, err
	}
	return m.newWorkspace(name, spec)
}

// contextWorkspace is the workspace name of a context id. The ids "." and
// ".." are refused before.
func contextWorkspace(id string) string { return "contexts/" + id }

// runWorkspace is the workspace name of an isolated run or pooled kernel.
func runWorkspace(id string) string { return "runs/" + id }

// wsRel is a caller's cwd relative to ws: a relative path as it is, an
// absolute one only when it lies in ws.
func wsRel(ws *workspace.Workspace, cwd string) (string, error) {
	if !filepath.IsAbs(cwd) {
		return cwd, nil
	}
	r, err := filepath.Rel(ws.Dir(), filepath.Clean(cwd))
	if err != nil || r == ".." || strings.HasPrefix(r, "../") {
		return "", errorf(ErrBadRequest, "cwd %s is outside the context's workspace %s: give a path relative to the workspace", cwd, ws.Dir())
	}
	return r, nil
}

// resolveCwd turns a caller's cwd into the absolute working directory
// inside ws: "" is ws itself; a relative path is below ws; an absolute one
// must lie in ws. The folder is made when missing.
func resolveCwd(ws *workspace.Workspace, cwd string) (string, error) {
	if cwd == "" {
		return ws.Dir(), nil
	}
	rel, err := wsRel(ws, cwd)
	if err != nil {
		return "", err
	}
	if _, err := ws.Mkdir(rel); err != nil {
		return "", errorf(ErrBadRequest, "cwd %s: %v", cwd, err)
	}
	return ws.Resolve(rel)
}

// dirEnv is what a kernel working in ws is started with.
func dirEnv(ws *workspace.Workspace) map[string]string {
	if ws == nil {
		return nil
	}
	return map[string]string{"DENO_DIR": filepath.Join(ws.Dir(), ".cache", "deno")}
}

// pipEnv is the environment pip runs with in a kernel working in ws.
func (cat *Catalog) pipEnv(ws *workspace.Workspace) map[string]string {
	base := filepath.Join(ws.Dir(), ".local")
	env := map[string]string{
		"PYTHONUSERBASE":                base,
		"PIP_USER":                      "1",
		"PIP_BREAK_SYSTEM_PACKAGES":     "1", // the user scheme of this workspace, never the system's
		"PIP_ROOT_USER_ACTION":          "ignore",
		"PIP_DISABLE_PIP_VERSION_CHECK": "1",
		"PIP_NO_WARN_SCRIPT_LOCATION":   "1",
	}
	if cat.cfg.PipIndexURL != "" {
		env["PIP_INDEX_URL"] = cat.cfg.PipIndexURL
	}
	if len(cat.cfg.PipFindLinks) > 0 {
		env["PIP_FIND_LINKS"] = strings.Join(cat.cfg.PipFindLinks, " ")
	}
	if cat.cfg.PipNoIndex {
		env["PIP_NO_INDEX"] = "1"
	}
	return env
}

// packageCode is the code a Python kernel working in ws runs once started:
// pip's variables, and the workspace's package folder on sys.path ahead of
// the system's (as a user site would be) without running its .pth files.
func (cat *Catalog) packageCode(spec *kernelspecs.Spec, ws *workspace.Workspace) string {
	if ws == nil || !strings.EqualFold(spec.Language, "python") {
		return ""
	}
	env := cat.pipEnv(ws)
	envJS, _ := json.Marshal(env)
	return `def _kg_packages(env):
    import os, sys, site
    os.environ.update(env)
    os.environ["PATH"] = os.path.join(env["PYTHONUSERBASE"], "bin") + os.pathsep + os.environ.get("PATH", "")
    site.USER_BASE, site.USER_SITE = env["PYTHONUSERBASE"], None
    p = site.getusersitepackages()
    os.makedirs(p, exist_ok=True)
    if p not in sys.path:
        i = min([sys.path.index(d) for d in site.getsitepackages() if d in sys.path] or [len(sys.path)])
        sys.path.insert(i, p)
_kg_packages(` + string(envJS) + `)
del _kg_packages
`
}

// MaxPackages bounds the packages of one create.
const MaxPackages = 64

// packageSpec is what a create may list: a requirement (name, extras,
// version specifiers) for Python, an npm:, jsr: or https: specifier for
// Deno; never an option.
var (
	pythonRequirement = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?\s*([<>=!~]=?=?\s*[A-Za-z0-9.*+!_-]+\s*,?\s*)*$`)
	denoSpecifier     = regexp.MustCompile(`^(npm:|jsr:|https://)[A-Za-z0-9@/._~:^=<>+-]+$`)
)

// checkPackages validates the packages of a create for spec's language.
func checkPackages(spec *kernelspecs.Spec, pkgs []string) error {
	if len(pkgs) > MaxPackages {
		return errorf(ErrBadRequest, "at most %d packages", MaxPackages)
	}
	lang := strings.ToLower(spec.Language)
	for _, p := range pkgs {
		ok := false
		switch lang {
		case "python":
			ok = len(p) <= 200 && pythonRequirement.MatchString(p)
		case "javascript", "typescript":
			ok = len(p) <= 300 && denoSpecifier.MatchString(p)
		default:
			return errorf(ErrBadRequest, "packages cannot be installed for %s kernels", spec.Language)
		}
		if !ok {
			if lang == "python" {
				return errorf(ErrBadRequest, "package %q: give a requirement such as name, name==1.2 or name[extra]>=1", p)
			}
			return errorf(ErrBadRequest, "package %q: give an npm:, jsr: or https: specifier", p)
		}
	}
	return nil
}

// installCode is the code that installs pkgs in a running kernel of spec,
// raising an error with pip's (or Deno's) message when it fails.
func installCode(spec *kernelspecs.Spec, pkgs []string) string {
	js, _ := json.Marshal(pkgs)
	if strings.EqualFold(spec.Language, "python") {
		return `def _kg_install(pkgs):
    import subprocess, sys, importlib
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--", *pkgs], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    importlib.invalidate_caches()
    if r.returncode != 0:
        out = (r.stderr.strip() or r.stdout.strip())[-4000:]
        raise RuntimeError("pip install " + " ".join(pkgs) + " failed: " + out)
_kg_install(` + string(js) + `)
del _kg_install
`
	}
	return `for (const p of ` + string(js) + `) {
  try { await import(p); } catch (e) { throw new Error("importing " + p + " failed: " + (e && e.message || e)); }
}
`
}

// installPackages installs pkgs into the context's workspace through its
// kernel.
func (c *Context) installPackages(ctx context.Context, pkgs []string) error {
	if len(pkgs) == 0 {
		return nil
	}
	k, _, err := c.ensureKernel(ctx)
	if err != nil {
		return err
	}
	evalue, err := runQuiet(ctx, k, installCode(c.spec, pkgs))
	if err != nil {
		return err
	}
	if evalue != "" {
		return errorf(ErrBadRequest, "%s", evalue)
	}
	return nil
}

// runQuiet runs code silently on k and returns the exception's value when
// it raised one.
func runQuiet(ctx context.Context, k *Kernel, code string) (string, error) {
	jk, err := k.running(ctx)
	if err != nil {
		return "", err
	}
	content := jupyter.NewExecute(code)
	content.Silent, content.StoreHistory = true, false
	call, err := startExecute(jk, content, nil)
	if err != nil {
		return "", err
	}
	reply, err := call.Wait(ctx)
	if err != nil {
		jk.Forget(call)
		if ctx.Err() != nil {
			return "", errorf(ErrTimeout, "the request ended before the packages were installed")
		}
		return "", err
	}
	var s struct {
		Status string `json:"status"`
		EName  string `json:"ename"`
		EValue string `json:"evalue"`
	}
	reply.DecodeContent(&s)
	if s.Status != "ok" {
		if s.EValue == "" {
			s.EValue = s.EName
		}
		if s.EValue == "" {
			s.EValue = "the kernel reported an error"
		}
		return s.EValue, nil
	}
	return "", nil
}

// LanguageInfo is a language the gateway runs.
type LanguageInfo struct {
	Language   string  `json:"language"`
	Kernelspec string  `json:"kernelspec"`
	Version    *string `json:"version"`
}

// LanguageInfos lists the languages with their kernelspec and the
// language version their kernels report (null until one has started).
func (m *Manager) LanguageInfos() []LanguageInfo {
	versions := map[string]string{}
	for _, k := range m.Kernels() {
		k.mu.Lock()
		jk := k.jk
		k.mu.Unlock()
		if jk != nil {
			if v := jk.Info().LanguageInfo.Version; v != "" {
				versions[k.spec.Name] = v
			}
		}
	}
	m.mu.Lock()
	for name, v := range versions {
		m.langVersions[name] = v
	}
	known := make(map[string]string, len(m.langVersions))
	for name, v := range m.langVersions {
		known[name] = v
	}
	m.mu.Unlock()
	var out []LanguageInfo
	for _, lang := range m.catalog.Languages() {
		spec := m.cfg.Languages[lang]
		li := LanguageInfo{Language: lang, Kernelspec: spec}
		if v, ok := known[spec]; ok {
			li.Version = &v
		}
		out = append(out, li)
	}
	if out == nil {
		out = []LanguageInfo{}
	}
	return out
}

// deleteWorkspace removes the workspace of a deleted context; at shutdown
// a context's workspace is kept (its files outlive the gateway where the
// root is kept), an isolated run's removed.
func (c *Context) deleteWorkspace() {
	// Its kernel is stopped (a kept one's context is not deleted).
	c.deleteSpare()
	if c.ws == nil || c.wsBorrowed {
		return
	}
	closing := false
	select {
	case <-c.m.closing:
		closing = true
	default:
	}
	if closing && !c.Isolated {
		c.ws.Close()
		return
	}
	if err := c.ws.Delete(); err != nil && !errors.Is(err, workspace.ErrClosed) {
		c.m.log.Warn("workspace not removed", "context", c.ID, "err", err)
	}
}

var _ = fmt.Sprint

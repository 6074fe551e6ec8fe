package gateway

// The checklist, 9-11: the kernel's environment (helpers in checklist_helpers_test.go).

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/google/uuid"

	"kernelgate/provision/local"
	"kernelgate/sessions"
)

// b4DeniedEnv are names a client may never set, each with a value that
// marks it.
var b4DeniedEnv = map[string]string{
	"LD_PRELOAD": "/kg-evil/x.so", "LD_LIBRARY_PATH": "/kg-evil", "PYTHONPATH": "/kg-evil",
	"PYTHONWARNINGS": "ignore::evilmod.X", "PYTHONSTARTUP": "/kg-evil/s.py", "PYTHONHOME": "/kg-evil",
	"PYTHONINSPECT": "kg-evil", "PYTHONBREAKPOINT": "kg_evil.x", "IPYTHONDIR": "/kg-evil",
	"JUPYTER_CONFIG_DIR": "/kg-evil", "JUPYTER_PATH": "/kg-evil", "HOME": "/kg-evil", "PATH": "/kg-evil",
	"DENO_V8_FLAGS": "--kg-evil", "DENO_DIR": "/kg-evil", "DENO_AUTH_TOKENS": "kg-evil@x", "DENO_CERT": "/kg-evil",
	"NODE_OPTIONS": "--require=/kg-evil.js", "HTTPS_PROXY": "http://kg-evil", "https_proxy": "http://kg-evil",
	"ALL_PROXY": "http://kg-evil", "BASH_ENV": "/kg-evil", "ENV": "/kg-evil", "GCONV_PATH": "/kg-evil",
	"KUBERNETES_SERVICE_HOST": "kg-evil", "ld_preload": "/kg-evil/y.so", "Path": "/kg-evil",
	"KERNELGATE_TOKEN": "kg-evil", "MALLOC_CONF": "kg-evil", "XDG_CONFIG_HOME": "/kg-evil",
}

// B4 #9: "env: LD_PRELOAD, PYTHONPATH, PYTHONWARNINGS=ignore::evilmod.X,
// IPYTHONDIR, JUPYTER_CONFIG_DIR, HOME, PATH, DENO_V8_FLAGS, NODE_OPTIONS,
// HTTPS_PROXY" → "400 (or dropped per documented policy); in-kernel
// os.environ/Deno.env proves absence".
//
// Policy: the code-interpreter API refuses such a name with 400; the
// Jupyter API drops every name that is not KERNEL_* or allow-listed, and a
// denied name stays denied even when an operator allow-lists it.
// TestKernelEnvAllowList (security_test.go) and TestExecuteErrorCodes
// cover LD_PRELOAD, PATH and an unlisted name; jupyter/kernelenv_test.go
// the deny list itself.
func TestB4_09_EnvNames(t *testing.T) {
	g := newGateway(t)
	for name, value := range b4DeniedEnv {
		for _, c := range []struct {
			path string
			body map[string]any
		}{
			{"/api/execute", map[string]any{"code": "1", "isolated": true, "env": map[string]string{name: value}}},
			{"/api/execute", map[string]any{"code": "1", "env": map[string]string{name: value}}},
			{"/api/contexts", map[string]any{"language": "python", "env": map[string]string{name: value}}},
			{"/api/contexts", map[string]any{"language": "javascript", "env": map[string]string{name: value}}},
		} {
			status, body := g.do("POST", c.path, c.body)
			if got := decode[map[string]any](t, body); status != http.StatusBadRequest || got["code"] != "BAD_REQUEST" {
				t.Errorf("POST %s env %s: %d %s, want 400", c.path, name, status, body)
			}
		}
	}
	if n := len(g.mgr.Kernels()); n != 0 {
		t.Errorf("%d kernels started with denied variables", n)
	}
	if n := len(g.mgr.Contexts()); n != 0 {
		t.Errorf("%d contexts created with denied variables", n)
	}

	// The Jupyter API drops them; the kernels prove it.
	probes := map[string]string{
		"python3": "import os; sorted(k for k, v in os.environ.items() if 'kg-evil' in v or 'evilmod' in v or 'kg_evil' in v)",
		"deno":    `JSON.stringify(Object.entries(Deno.env.toObject()).filter(([k, v]) => /kg-evil|evilmod|kg_evil/.test(v)).map(([k]) => k))`,
	}
	want := map[string]string{"python3": "[]", "deno": `"[]"`}
	for spec, probe := range probes {
		status, body := g.do("POST", "/api/kernels", map[string]any{"name": spec, "env": b4DeniedEnv})
		if status != http.StatusCreated {
			t.Fatalf("POST /api/kernels %s with denied env: %d %s", spec, status, body)
		}
		k := decode[sessions.KernelModel](t, body)
		c := g.mustDial(k.ID, true)
		if got := b4WSResult(t, c, probe); got != want[spec] {
			t.Errorf("%s kernel sees denied variables: %s", spec, got)
		}
	}

	t.Run("allow-listed by mistake", func(t *testing.T) {
		mistakes := []string{"LD_PRELOAD", "PYTHONPATH", "NODE_OPTIONS", "HTTPS_PROXY", "HOME"}
		g := newGateway(t, func(m *sessions.Config, _ *Config) { m.EnvAllow = mistakes })
		env := map[string]string{}
		for _, n := range mistakes {
			env[n] = b4DeniedEnv[n]
		}
		status, body := g.do("POST", "/api/kernels", map[string]any{"name": "python3", "env": env})
		switch status {
		case http.StatusBadRequest:
		case http.StatusCreated:
			k := decode[sessions.KernelModel](t, body)
			c := g.mustDial(k.ID, true)
			if got := b4WSResult(t, c, probes["python3"]); got != "[]" {
				t.Errorf("kernel sees denied, allow-listed variables: %s", got)
			}
		default:
			t.Errorf("POST /api/kernels with denied but allow-listed names: %d %s; want 400 (a refused variable is the client's error) or the names dropped", status, body)
		}
	})
}

// B4 #10: "env values $(id), backticks, \n, NUL, 1 MiB,
// number/object/null, 10 000 keys" → "400, value not echoed (EG 83f54a88)".
//
// Policy: values reach the kernel through execve's environment, never a
// shell, so $(id), backticks and ${…} are accepted and stay inert (the
// kernel sees them literally); NUL, CR, LF, values over 4096 bytes,
// non-strings and more than 64 variables are refused with 400.
// TestBadRequests covers a number and a newline on POST /api/kernels.
func TestB4_10_EnvValues(t *testing.T) {
	g := newGateway(t)
	const mark = "KG-ECHO-MARK"
	many := map[string]string{}
	manyKernel := map[string]string{}
	for i := 0; i < 10000; i++ {
		many[fmt.Sprintf("V%d", i)] = mark
		manyKernel[fmt.Sprintf("KERNEL_V%d", i)] = mark
	}
	values := map[string]json.RawMessage{}
	for name, v := range map[string]any{
		"newline": "a\n" + mark, "carriage return": "a\r" + mark, "NUL": "a\x00" + mark,
		"4097 bytes": mark + strings.Repeat("x", 4097), "1 MiB": mark + strings.Repeat("x", 1<<20),
		"number": 12345678, "object": map[string]string{"x": mark}, "null": nil, "bool": true, "array": []string{mark},
	} {
		values[name], _ = json.Marshal(v)
	}
	type route struct {
		path   string
		prefix string // of the variable's name
		body   func(env json.RawMessage) string
	}
	routes := []route{
		{"/api/execute", "K", func(env json.RawMessage) string { return `{"code":"1","isolated":true,"env":` + string(env) + `}` }},
		{"/api/contexts", "K", func(env json.RawMessage) string { return `{"language":"python","env":` + string(env) + `}` }},
		{"/api/kernels", "KERNEL_K", func(env json.RawMessage) string { return `{"name":"python3","env":` + string(env) + `}` }},
	}
	for _, r := range routes {
		for name, v := range values {
			env := json.RawMessage(`{"` + r.prefix + `":` + string(v) + `}`)
			status, body := g.doWith("POST", r.path, r.body(env), map[string]string{"Authorization": "token " + testToken, "Content-Type": "application/json"})
			if status != http.StatusBadRequest {
				t.Errorf("POST %s env value %s: %d %.300s, want 400", r.path, name, status, body)
			}
			if bytes.Contains(body, []byte(mark)) || bytes.Contains(body, []byte("12345678")) {
				t.Errorf("POST %s env value %s: the value is echoed: %.300s", r.path, name, body)
			}
		}
		m := many
		if r.path == "/api/kernels" {
			m = manyKernel
		}
		js, _ := json.Marshal(m)
		status, body := g.doWith("POST", r.path, r.body(js), map[string]string{"Authorization": "token " + testToken, "Content-Type": "application/json"})
		if status != http.StatusBadRequest {
			t.Errorf("POST %s with 10 000 variables: %d %.300s, want 400", r.path, status, body)
		}
		if bytes.Contains(body, []byte(mark)) {
			t.Errorf("POST %s with 10 000 variables echoes a value", r.path)
		}
	}
	for _, k := range g.mgr.Kernels() {
		g.do("DELETE", "/api/kernels/"+k.ID(), nil)
	}

	// Shell syntax is inert: the kernel sees it literally.
	inert := map[string]string{"KERNEL_A": "$(id)", "KERNEL_B": "`id`", "KERNEL_C": "${HOME};id|sh"}
	e := g.run(map[string]any{"code": "import os; [os.environ[k] for k in ('KERNEL_A', 'KERNEL_B', 'KERNEL_C')]", "isolated": true, "env": inert})
	if want := "['$(id)', '`id`', '${HOME};id|sh']"; b4Result(e) != want {
		t.Errorf("isolated run sees %q, want %s", b4Result(e), want)
	}
	status, body := g.do("POST", "/api/kernels", map[string]any{"name": "python3", "env": inert})
	if status != http.StatusCreated {
		t.Fatalf("POST /api/kernels with shell syntax in values: %d %s", status, body)
	}
	c := g.mustDial(decode[sessions.KernelModel](t, body).ID, true)
	if got := b4WSResult(t, c, "import os; [os.environ[k] for k in ('KERNEL_A', 'KERNEL_B', 'KERNEL_C')]"); got != "['$(id)', '`id`', '${HOME};id|sh']" {
		t.Errorf("Jupyter kernel sees %s", got)
	}
}

// b4SecretsProbe prints what a kernel finds of the gateway's secrets.
const b4SecretsProbe = `
import hashlib, json, os
def read(p):
    try:
        with open(p, 'rb') as f:
            b = f.read()
        return {'ok': True, 'sha': hashlib.sha256(b).hexdigest(), 'len': len(b),
                'token': TOKEN.encode() in b, 'marker': MARKER.encode() in b}
    except OSError as e:
        return {'ok': False, 'err': type(e).__name__}
env = '\n'.join(k + '=' + v for k, v in os.environ.items())
print(json.dumps({
    'env_token': TOKEN in env or CONFIG_TOKEN in env,
    'env_marker': MARKER in env,
    'env_names': sorted(k for k in os.environ if k.startswith(('KERNELGATE', 'KUBERNETES', 'KG_B4'))),
    'gw_environ': read('/proc/%d/environ' % GWPID),
    'gw_cmdline': read('/proc/%d/cmdline' % GWPID),
    'init_environ': read('/proc/1/environ'),
    'sa_token': read('/var/run/secrets/kubernetes.io/serviceaccount/token'),
}))
`

type b4ReadResult struct {
	OK     bool   `json:"ok"`
	Err    string `json:"err"`
	SHA    string `json:"sha"`
	Len    int    `json:"len"`
	Token  bool   `json:"token"`
	Marker bool   `json:"marker"`
}

type b4Secrets struct {
	EnvToken    bool         `json:"env_token"`
	EnvMarker   bool         `json:"env_marker"`
	EnvNames    []string     `json:"env_names"`
	GWEnviron   b4ReadResult `json:"gw_environ"`
	GWCmdline   b4ReadResult `json:"gw_cmdline"`
	InitEnviron b4ReadResult `json:"init_environ"`
	SAToken     b4ReadResult `json:"sa_token"`
}

// B4 #11: "Gateway secrets in kernel: os.environ, /proc/1/environ,
// /proc/<gateway>/environ, SA token path, KUBERNETES_SERVICE_HOST" → "none
// present/readable (EG test_kernel_env_auth_token)".
//
// A kernel's environment is built from scratch (local.CleanEnv), so
// nothing of the gateway's reaches os.environ. /proc is another matter:
// without the sandbox a kernel runs as the gateway's user and can read
// /proc/<gateway>/environ and cmdline (a token passed by --token or
// KERNELGATE_TOKEN is in one of them); the test records what is true. With
// the sandbox the kernel has a PID namespace and its own /proc: the
// gateway is not there. (t.Setenv changes this process's environment but
// not /proc/self/environ, which holds the environment it was started
// with, so readability is shown by comparing digests of the file.)
func TestB4_11_GatewaySecrets(t *testing.T) {
	const marker = "kg-b4-marker-5f1e0c"
	envToken := "kg-b4-env-token-" + uuid.NewString()
	t.Setenv("KERNELGATE_TOKEN", envToken)
	t.Setenv("KG_B4_MARKER", marker)
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	own, err := os.ReadFile("/proc/self/environ")
	if err != nil {
		t.Fatal(err)
	}
	ownSum := sha256.Sum256(own)
	code := fmt.Sprintf("TOKEN, CONFIG_TOKEN, MARKER, GWPID = %q, %q, %q, %d\n", envToken, testToken, marker, os.Getpid()) + b4SecretsProbe
	probe := func(t *testing.T, g *testGateway) b4Secrets {
		var s b4Secrets
		b4JSON(t, g, "", code, &s)
		if s.EnvToken || s.EnvMarker || len(s.EnvNames) > 0 {
			t.Errorf("the kernel's environment holds gateway variables: token %v, marker %v, names %v", s.EnvToken, s.EnvMarker, s.EnvNames)
		}
		if s.SAToken.OK {
			t.Errorf("a service-account token is readable")
		}
		if s.InitEnviron.Token || s.InitEnviron.Marker {
			t.Errorf("/proc/1/environ holds the gateway's secrets")
		}
		return s
	}

	t.Run("plain", func(t *testing.T) {
		// What the README says of unsandboxed kernels, which run as the
		// gateway's user: they read its startup environment and command
		// line (so --token there leaks; KERNELGATE_TOKEN or --token-file
		// with --sandbox do not).
		g := newGateway(t)
		s := probe(t, g)
		if !s.GWEnviron.OK || s.GWEnviron.SHA != hex.EncodeToString(ownSum[:]) || !s.GWCmdline.OK {
			t.Errorf("an unsandboxed kernel no longer reads the gateway's /proc/%d (environ %+v, cmdline %+v): update the README's \"Giving the token safely\"",
				os.Getpid(), s.GWEnviron, s.GWCmdline)
		}
	})

	t.Run("sandboxed", func(t *testing.T) {
		b4NeedSandbox(t)
		g := newGateway(t, b4Sandboxed(local.SandboxConfig{}))
		s := probe(t, g)
		if s.GWEnviron.OK && s.GWEnviron.SHA == hex.EncodeToString(ownSum[:]) {
			t.Errorf("sandboxed kernel reads the gateway's /proc/%d/environ", os.Getpid())
		}
		if s.GWEnviron.Token || s.GWEnviron.Marker || s.GWCmdline.Token {
			t.Errorf("sandboxed kernel finds gateway secrets in /proc")
		}
	})
}

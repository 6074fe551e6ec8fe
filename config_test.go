package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConfigFlagsAndEnv(t *testing.T) {
	env := map[string]string{
		"KERNELGATE_PORT":              "9999",
		"KERNELGATE_TOKEN":             "from-env",
		"KERNELGATE_ALLOW_ORIGIN":      "https://a.example, https://b.example",
		"KERNELGATE_KERNELSPEC_DIRS":   "/x,/y",
		"KERNELGATE_CULL_IDLE_TIMEOUT": "10m",
		"KERNELGATE_MAX_KERNELS":       "7",
	}
	getenv := func(k string) string { return env[k] }
	c, err := parseConfig([]string{"--port", "1234", "--cull-busy"}, getenv, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Port != 1234 {
		t.Errorf("a flag must win over the environment: port %d", c.Port)
	}
	if c.Token != "from-env" || c.MaxKernels != 7 || c.CullIdle != 10*time.Minute || !c.CullBusy {
		t.Errorf("config %+v", c)
	}
	if strings.Join(c.AllowOrigins, " ") != "https://a.example https://b.example" || strings.Join(c.KernelspecDirs, " ") != "/x /y" {
		t.Errorf("lists %v %v", c.AllowOrigins, c.KernelspecDirs)
	}
	if c.IP != "127.0.0.1" || c.PoolSize != 1 || c.PoolPrewarm[0] != "python" {
		t.Errorf("defaults %+v", c)
	}
	if _, err := parseConfig([]string{"--port", "70000"}, func(string) string { return "" }, &bytes.Buffer{}); err == nil {
		t.Error("port out of range accepted")
	}
	if _, err := parseConfig(nil, func(k string) string {
		if k == "KERNELGATE_MAX_KERNELS" {
			return "many"
		}
		return ""
	}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "KERNELGATE_MAX_KERNELS") {
		t.Errorf("bad env value: %v", err)
	}
	if c.PythonLauncher != "fork" {
		t.Errorf("--python-launcher defaults to %q", c.PythonLauncher)
	}
	if c, err := parseConfig(nil, func(k string) string {
		if k == "KERNELGATE_PYTHON_LAUNCHER" {
			return "exec"
		}
		return ""
	}, &bytes.Buffer{}); err != nil || c.PythonLauncher != "exec" {
		t.Errorf("KERNELGATE_PYTHON_LAUNCHER=exec: %v %v", c, err)
	}
	if _, err := parseConfig([]string{"--python-launcher", "spawn"}, func(string) string { return "" }, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "--python-launcher") {
		t.Errorf("--python-launcher spawn: %v", err)
	}
	c, _ = parseConfig([]string{"--language", "python=py311", "--language", "r=ir"}, func(string) string { return "" }, &bytes.Buffer{})
	if langs, err := c.languages(); err != nil || langs["python"] != "py311" || langs["r"] != "ir" {
		t.Errorf("languages %v %v", langs, err)
	}
}

func TestHelpListsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"--help"}, &out, &out); code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, f := range []string{"--ip", "--port", "--token", "--allow-origin", "--kernelspec-dir", "KERNELGATE_KERNELSPEC_DIRS", "--max-kernels", "--cull-idle-timeout", "--pool-size"} {
		if !strings.Contains(out.String(), f) {
			t.Errorf("--help lacks %s", f)
		}
	}
}

func TestRefusesOpenAddressWithoutToken(t *testing.T) {
	var out bytes.Buffer
	c, _ := parseConfig([]string{"--ip", "0.0.0.0"}, func(string) string { return "" }, &out)
	err := serve(c, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "without a token") {
		t.Fatalf("err = %v", err)
	}
}

func TestGatewayProcs(t *testing.T) {
	for _, c := range []struct {
		flag    int
		envSet  bool
		current int
		want    int
	}{
		{0, false, 2, 1},  // two CPUs: one for the gateway
		{0, false, 1, 1},  // never zero
		{0, false, 16, 8}, // half
		{0, false, 7, 3},
		{0, true, 2, 2}, // GOMAXPROCS from the environment is kept
		{4, true, 2, 4}, // the flag wins
		{3, false, 16, 3},
	} {
		if got := gatewayProcs(c.flag, c.envSet, c.current); got != c.want {
			t.Errorf("gatewayProcs(%d, %v, %d) = %d, want %d", c.flag, c.envSet, c.current, got, c.want)
		}
	}
}

func TestConfigStateDir(t *testing.T) {
	none := func(string) string { return "" }
	for _, tc := range []struct {
		args    []string
		env     string
		dir     string
		wantSet bool
	}{
		{nil, "", "", false},
		{[]string{"--state-dir", ""}, "", "", true},
		{[]string{"--state-dir", "/srv/kg"}, "/env", "/srv/kg", true},
		{nil, "/env", "/env", true},
	} {
		getenv := none
		if tc.env != "" {
			getenv = func(k string) string {
				if k == "KERNELGATE_STATE_DIR" {
					return tc.env
				}
				return ""
			}
		}
		c, err := parseConfig(tc.args, getenv, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if c.StateDir != tc.dir || c.StateDirSet != tc.wantSet {
			t.Errorf("%v env %q: state dir %q set %v, want %q %v", tc.args, tc.env, c.StateDir, c.StateDirSet, tc.dir, tc.wantSet)
		}
	}
}

func TestTokenFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("  from-file-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	none := func(string) string { return "" }
	c, err := parseConfig([]string{"--token-file", file}, none, &bytes.Buffer{})
	if err != nil || c.Token != "from-file-secret" || len(c.secretsInArgv) != 0 {
		t.Fatalf("--token-file: %+v %v", c, err)
	}
	c, err = parseConfig(nil, func(k string) string {
		if k == "KERNELGATE_TOKEN_FILE" {
			return file
		}
		return ""
	}, &bytes.Buffer{})
	if err != nil || c.Token != "from-file-secret" {
		t.Fatalf("KERNELGATE_TOKEN_FILE: %+v %v", c, err)
	}
	if _, err := parseConfig([]string{"--token-file", file}, func(k string) string {
		if k == "KERNELGATE_TOKEN" {
			return "other"
		}
		return ""
	}, &bytes.Buffer{}); err == nil {
		t.Error("a token from both a file and the environment was accepted")
	}
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	for _, f := range []string{empty, filepath.Join(dir, "missing")} {
		if _, err := parseConfig([]string{"--token-file", f}, none, &bytes.Buffer{}); err == nil {
			t.Errorf("--token-file %s accepted", f)
		}
	}
	c, _ = parseConfig(nil, func(k string) string {
		if k == "KERNELGATE_TOKEN" {
			return "env-secret"
		}
		return ""
	}, &bytes.Buffer{})
	if len(c.secretsInArgv) != 0 {
		t.Errorf("a token from the environment counted as given on the command line")
	}
}

func TestTokenOnTheCommandLineIsWarnedOf(t *testing.T) {
	var out bytes.Buffer
	// --procs -1 stops serve right after its first log lines.
	c, err := parseConfig([]string{"--token", "argv-secret-123", "--procs", "-1"}, func(string) string { return "" }, &out)
	if err != nil {
		t.Fatal(err)
	}
	if err := serve(c, &out, &out); err == nil {
		t.Fatal("serve accepted --procs -1")
	}
	if !strings.Contains(out.String(), "level=WARN") || !strings.Contains(out.String(), "--token-file") {
		t.Errorf("no warning of the token on the command line:\n%s", out.String())
	}
	if strings.Contains(out.String(), "argv-secret-123") {
		t.Errorf("the log holds the token:\n%s", out.String())
	}
	var help bytes.Buffer
	run([]string{"--help"}, &help, &help)
	for _, want := range []string{"--token-file", "KERNELGATE_TOKEN_FILE", "every local user can read it"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("--help does not say %q", want)
		}
	}
}

func TestConfigKeepKernels(t *testing.T) {
	env := func(k string) string {
		return map[string]string{"KERNELGATE_KEEP_KERNELS": "true", "KERNELGATE_ORPHAN_TIMEOUT": "2m"}[k]
	}
	c, err := parseConfig(nil, env, &bytes.Buffer{})
	if err != nil || !c.KeepKernels || c.OrphanTimeout != 2*time.Minute {
		t.Fatalf("from the environment: %+v %v", c, err)
	}
	c, err = parseConfig(nil, func(string) string { return "" }, &bytes.Buffer{})
	if err != nil || c.KeepKernels || c.OrphanTimeout != 15*time.Minute {
		t.Fatalf("defaults: keep %v orphan timeout %v %v", c.KeepKernels, c.OrphanTimeout, err)
	}
	if _, err := parseConfig([]string{"--orphan-timeout", "1s"}, func(string) string { return "" }, &bytes.Buffer{}); err == nil {
		t.Fatal("an orphan timeout of 1s was taken")
	}
}

//go:build linux

package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// nbconvert runs a notebook on kernelgate through Jupyter Server's
// GatewayKernelManager, as nbclient and papermill do against a remote
// gateway. Its GatewayKernelClient sends each header's date in epoch
// seconds, a number, and sends no token on its websocket: the gateway
// runs without one (loopback only).
func TestNbconvertThroughGatewayKernelManager(t *testing.T) {
	if out, err := exec.Command("/usr/bin/python3", "-c", "import nbconvert, jupyter_server").CombinedOutput(); err != nil {
		t.Fatalf("nbconvert or Jupyter Server is missing: run `make test-deps` (Debian packages python3-nbconvert, python3-jupyter-server): %s", out)
	}
	bin := buildBinary(t)
	gw := startGateway(t, bin)

	dir := t.TempDir()
	nb := `{"cells": [
  {"cell_type": "code", "id": "c1", "execution_count": null, "metadata": {}, "outputs": [], "source": ["print('hello from', 6 * 7)"]},
  {"cell_type": "code", "id": "c2", "execution_count": null, "metadata": {}, "outputs": [], "source": ["x = 21\n", "x * 2"]},
  {"cell_type": "code", "id": "c3", "execution_count": null, "metadata": {}, "outputs": [], "source": ["import sys; print('to stderr', file=sys.stderr)"]}
 ],
 "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
 "nbformat": 4, "nbformat_minor": 5}`
	if err := os.WriteFile(filepath.Join(dir, "in.ipynb"), []byte(nb), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", "-m", "nbconvert", "--to", "notebook", "--execute",
		"--ExecutePreprocessor.kernel_manager_class=jupyter_server.gateway.managers.GatewayKernelManager",
		"--ExecutePreprocessor.startup_timeout=30", "--ExecutePreprocessor.timeout=60",
		"--output", "out.ipynb", "in.ipynb")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "JUPYTER_GATEWAY_URL="+strings.TrimSuffix(gw.url, "/"),
		"JUPYTER_CONFIG_DIR="+t.TempDir(), "JUPYTER_DATA_DIR="+t.TempDir(), "JUPYTER_RUNTIME_DIR="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nbconvert: %v\n%s\nkernelgate:\n%s", err, out, gw.logs)
	}

	b, err := os.ReadFile(filepath.Join(dir, "out.ipynb"))
	if err != nil {
		t.Fatal(err)
	}
	var executed struct {
		Cells []struct {
			Outputs []struct {
				OutputType string                     `json:"output_type"`
				Name       string                     `json:"name"`
				Text       json.RawMessage            `json:"text"`
				Data       map[string]json.RawMessage `json:"data"`
			} `json:"outputs"`
		} `json:"cells"`
	}
	if err := json.Unmarshal(b, &executed); err != nil {
		t.Fatalf("executed notebook: %v\n%s", err, b)
	}
	var got []string
	for _, c := range executed.Cells {
		var outs []string
		for _, o := range c.Outputs {
			switch o.OutputType {
			case "stream":
				outs = append(outs, o.Name+": "+notebookText(t, o.Text))
			case "execute_result":
				outs = append(outs, "result: "+notebookText(t, o.Data["text/plain"]))
			default:
				outs = append(outs, o.OutputType)
			}
		}
		got = append(got, strings.Join(outs, " | "))
	}
	want := []string{"stdout: hello from 42\n", "result: 42", "stderr: to stderr\n"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("outputs of the executed notebook:\n%q\nwant\n%q", got, want)
	}

	// nbclient shut its kernel down when it was done.
	resp, err := http.Get(gw.url + "api/kernels")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if body, _ := io.ReadAll(resp.Body); strings.TrimSpace(string(body)) != "[]" {
		t.Errorf("kernels left after nbconvert: %s", body)
	}
}

// notebookText is a notebook's multiline string: one string or a list.
func notebookText(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err != nil {
		t.Fatalf("notebook text %s: %v", raw, err)
	}
	return strings.Join(lines, "")
}

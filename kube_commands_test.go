//go:build linux

package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kubeprov "kernelgate/provision/kubernetes"
)

// kubeRun is what these tests read of a command's Execution.
type kubeRun struct {
	ID   string `json:"id"`
	Logs struct {
		Stdout []string `json:"stdout"`
		Stderr []string `json:"stderr"`
	} `json:"logs"`
	Process *struct {
		ExitCode *int   `json:"exitCode"`
		Reason   string `json:"reason"`
	} `json:"process"`
}

func (r kubeRun) stdout() string { return strings.Join(r.Logs.Stdout, "") }
func (r kubeRun) stderr() string { return strings.Join(r.Logs.Stderr, "") }

// ended is "reason/exitCode".
func (r kubeRun) ended() string {
	if r.Process == nil || r.Process.ExitCode == nil {
		return "running"
	}
	return r.Process.Reason + "/" + strconv.Itoa(*r.Process.ExitCode)
}

// command runs a command in a context and returns its Execution.
func (p *gatewayProcess) command(t *testing.T, ctx string, body map[string]any) kubeRun {
	t.Helper()
	code, b := p.call(t, "POST", "/api/contexts/"+ctx+"/commands", body)
	if code != http.StatusOK {
		t.Fatalf("command %v: %d %s\n%s", body, code, b, p.logs)
	}
	var r kubeRun
	json.Unmarshal(b, &r)
	return r
}

// background starts a command and returns its run's id.
func (p *gatewayProcess) background(t *testing.T, ctx string, body map[string]any) string {
	t.Helper()
	body["background"] = true
	code, b := p.call(t, "POST", "/api/contexts/"+ctx+"/commands", body)
	if code != http.StatusAccepted {
		t.Fatalf("command %v: %d %s\n%s", body, code, b, p.logs)
	}
	var r struct{ Run string }
	json.Unmarshal(b, &r)
	return r.Run
}

// run reads a run's state and Execution.
func (p *gatewayProcess) run(t *testing.T, id string) (string, kubeRun) {
	t.Helper()
	code, b := p.call(t, "GET", "/api/runs/"+id, nil)
	if code != http.StatusOK {
		t.Fatalf("GET /api/runs/%s: %d %s", id, code, b)
	}
	var m struct {
		State     string  `json:"state"`
		Execution kubeRun `json:"execution"`
	}
	json.Unmarshal(b, &m)
	return m.State, m.Execution
}

// waitRun waits until the run's Execution satisfies ok.
func (p *gatewayProcess) waitRun(t *testing.T, id, what string, ok func(state string, r kubeRun) bool) kubeRun {
	t.Helper()
	var r kubeRun
	var state string
	if !pollUntil(time.Minute, func() bool {
		state, r = p.run(t, id)
		return ok(state, r)
	}) {
		t.Fatalf("run %s never %s: %s %+v", id, what, state, r)
	}
	return r
}

// TestKubernetesCommands runs commands in a context whose kernel is a pod:
// they run in that pod (its env, the files its kernel wrote in its cwd),
// with exit codes, stdout and stderr apart, stdin, interrupt and kill.
func TestKubernetesCommands(t *testing.T) {
	e := startKubeEnv(t)
	gw := e.gateway(t, "commands", "--pool-size", "0")
	code, b := gw.call(t, "POST", "/api/contexts", map[string]string{"language": "python"})
	if code != http.StatusCreated {
		t.Fatalf("context: %d %s", code, b)
	}
	ctxID := mustID(t, b)
	code, b = gw.call(t, "POST", "/api/execute", map[string]any{"context": ctxID,
		"code": "open('from-kernel.txt', 'w').write('written by the kernel')"})
	if code != http.StatusOK {
		t.Fatalf("execute: %d %s", code, b)
	}
	pods, err := e.cp.Client.CoreV1().Pods(kubeNS).List(context.Background(), metav1.ListOptions{LabelSelector: kubeprov.LabelRelease + "=commands"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the context's pod: %v %d pods", err, len(pods.Items))
	}
	pod := pods.Items[0].Name

	t.Run("InThePod", func(t *testing.T) {
		r := gw.command(t, ctxID, map[string]any{
			"cmd": `cat from-kernel.txt; echo; echo "$HOSTNAME $KERNELGATE_KERNEL_NAME $GREETING"; echo oops >&2; exit 3`,
			"env": map[string]string{"GREETING": "hello"},
		})
		if want := "written by the kernel\n" + pod + " python3 hello\n"; r.stdout() != want {
			t.Errorf("stdout %q, want %q", r.stdout(), want)
		}
		if r.stderr() != "oops\n" || r.ended() != "completed/3" {
			t.Errorf("stderr %q, ended %s; want oops and completed/3", r.stderr(), r.ended())
		}
	})

	t.Run("NoProgram", func(t *testing.T) {
		code, b := gw.call(t, "POST", "/api/contexts/"+ctxID+"/commands", map[string]any{"cmd": []string{"no-such-program"}})
		if code != http.StatusBadRequest || !strings.Contains(string(b), "no-such-program") {
			t.Errorf("no such program: %d %s, want 400 naming it", code, b)
		}
	})

	t.Run("Stdin", func(t *testing.T) {
		id := gw.background(t, ctxID, map[string]any{"cmd": "read a; echo got:$a; wc -l", "stdin": true})
		for _, body := range []map[string]any{{"value": "one\n"}, {"value": "x\ny\n", "eof": true}} {
			if code, b := gw.call(t, "POST", "/api/runs/"+id+"/input", body); code != http.StatusNoContent {
				t.Fatalf("input %v: %d %s", body, code, b)
			}
		}
		r := gw.waitRun(t, id, "done", func(state string, _ kubeRun) bool { return state == "done" })
		if r.stdout() != "got:one\n2\n" || r.ended() != "completed/0" {
			t.Errorf("stdin: %q %s", r.stdout(), r.ended())
		}
	})

	t.Run("Interrupt", func(t *testing.T) {
		id := gw.background(t, ctxID, map[string]any{"cmd": "trap 'echo got INT; exit 5' INT; echo ready; while :; do sleep 0.1; done"})
		gw.waitRun(t, id, "ready", func(_ string, r kubeRun) bool { return strings.Contains(r.stdout(), "ready") })
		if code, b := gw.call(t, "POST", "/api/runs/"+id+"/interrupt", nil); code != http.StatusNoContent {
			t.Fatalf("interrupt: %d %s", code, b)
		}
		r := gw.waitRun(t, id, "done", func(state string, _ kubeRun) bool { return state == "done" })
		if r.ended() != "interrupted/5" || !strings.Contains(r.stdout(), "got INT") {
			t.Errorf("interrupted: %s %q", r.ended(), r.stdout())
		}
	})

	t.Run("Kill", func(t *testing.T) {
		id := gw.background(t, ctxID, map[string]any{"cmd": "trap '' INT TERM; echo started; sleep 300"})
		gw.waitRun(t, id, "started", func(_ string, r kubeRun) bool { return strings.Contains(r.stdout(), "started") })
		if code, b := gw.call(t, "POST", "/api/runs/"+id+"/kill", nil); code != http.StatusNoContent {
			t.Fatalf("kill: %d %s", code, b)
		}
		if r := gw.waitRun(t, id, "done", func(state string, _ kubeRun) bool { return state == "done" }); r.ended() != "killed/137" {
			t.Errorf("killed: %s", r.ended())
		}
	})

	t.Run("LostWithThePod", func(t *testing.T) {
		id := gw.background(t, ctxID, map[string]any{"cmd": "echo started; sleep 300"})
		gw.waitRun(t, id, "started", func(_ string, r kubeRun) bool { return strings.Contains(r.stdout(), "started") })
		if err := e.cp.Client.CoreV1().Pods(kubeNS).Delete(context.Background(), pod, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if r := gw.waitRun(t, id, "done", func(state string, _ kubeRun) bool { return state == "done" }); r.ended() != "lost/137" {
			t.Errorf("a command of a deleted pod: %s", r.ended())
		}
	})
}

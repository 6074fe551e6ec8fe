//go:build linux

package kubernetes

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"kernelgate/jupyter"
)

// The wrapper's environment preamble, read by this machine's /bin/sh,
// gives the command every byte of each value back, and the command reads
// the rest of stdin.
func TestCommandWrapperEnv(t *testing.T) {
	env := map[string]string{
		"PLAIN": "value", "EMPTY": "", "SPACES": "  two  spaces ", "LINES": "a\nb\n\n",
		"BACKSLASH": `\n is not a newline \\ \0101`, "CONTROL": "\x01\x1b\x7f", "PERCENT": "%s %b %%",
		"UTF8": "héllo ✓",
	}
	cmd := exec.Command("/bin/sh", "-c", commandScript, "sh", "MARK", "", "", "/bin/sh", "-c",
		`for n in PLAIN EMPTY SPACES LINES BACKSLASH CONTROL PERCENT UTF8; do eval "printf '%s=[%s]|' \"\$n\" \"\$$n\""; done; cat`)
	cmd.Stdin = strings.NewReader(string(envPreamble(env)) + "the rest\n")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %s", err, errOut.String())
	}
	var want strings.Builder
	for _, n := range []string{"PLAIN", "EMPTY", "SPACES", "LINES", "BACKSLASH", "CONTROL", "PERCENT", "UTF8"} {
		want.WriteString(n + "=[" + env[n] + "]|")
	}
	want.WriteString("the rest\n")
	if out.String() != want.String() {
		t.Errorf("stdout\n%q\nwant\n%q", out.String(), want.String())
	}
	if !strings.HasPrefix(errOut.String(), "MARK pgid ") {
		t.Errorf("stderr %q, want the group's report first", errOut.String())
	}
}

// The report is found however the stream splits stderr, and what follows
// it passes on; a first line that is no report passes on whole.
func TestMarkWriter(t *testing.T) {
	for _, c := range []struct {
		name   string
		writes []string
		report string
		out    string
	}{
		{"whole", []string{"M pgid 42\nerr\n"}, "pgid 42", "err\n"},
		{"split", []string{"M p", "gid 4", "2", "\ner", "r\n"}, "pgid 42", "err\n"},
		{"no report", []string{"sh: oops\n", "more"}, "", "sh: oops\nmore"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			report := make(chan string, 1)
			w := &markWriter{mark: "M ", w: &out, report: report}
			for _, s := range c.writes {
				if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
					t.Fatalf("Write %q: %d %v", s, n, err)
				}
			}
			select {
			case r := <-report:
				if r != c.report {
					t.Errorf("report %q, want %q", r, c.report)
				}
			default:
				t.Errorf("nothing reported")
			}
			if out.String() != c.out {
				t.Errorf("passed on %q, want %q", out.String(), c.out)
			}
		})
	}
}

// A name sh cannot export is refused before anything runs.
func TestCommandBadEnvName(t *testing.T) {
	pp := &podProcess{p: &Provisioner{Config: &rest.Config{}}, done: make(chan struct{})}
	for _, name := range []string{"1ABC", "A-B", "A B", "É", ""} {
		_, err := pp.StartCommand(context.Background(), jupyter.CommandRequest{Argv: []string{"true"}, Env: map[string]string{name: "x"}})
		if err == nil || !strings.Contains(err.Error(), "no environment variable") {
			t.Errorf("env name %q: %v", name, err)
		}
	}
}

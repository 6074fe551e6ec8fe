//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// row is one line of the table. Empty cells print as —.
type row struct {
	figure, kg, direct, js, ratios string
}

// goal is a target of kernelgate's earlier issues and whether it was met.
type goal struct {
	what, measured string
	met            bool
	// why a missed goal was missed, where it is known
	why string
}

func (b *bench) add(r row) { b.rows = append(b.rows, r) }

func (b *bench) check(what string, met bool, format string, args ...any) {
	b.goals = append(b.goals, goal{what: what, measured: fmt.Sprintf(format, args...), met: met})
}

// missedBecause gives the reason the last goal checked was missed, shown
// when it was.
func (b *bench) missedBecause(why string) {
	b.goals[len(b.goals)-1].why = why
}

func cell(s string) string {
	if s == "" {
		return "—"
	}
	return strings.ReplaceAll(s, "|", "\\|")
}

// renderTable renders the rows as a markdown table.
func renderTable(rows []row) string {
	var b strings.Builder
	b.WriteString("| Figure | kernelgate | direct | Jupyter Server | Ratios |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", cell(r.figure), cell(r.kg), cell(r.direct), cell(r.js), cell(r.ratios))
	}
	return b.String()
}

func renderGoals(goals []goal) string {
	if len(goals) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("Goals of the earlier issues:\n\n")
	for _, g := range goals {
		mark := "met"
		if !g.met {
			mark = "**missed**"
		}
		fmt.Fprintf(&b, "- %s: %s (%s)", g.what, mark, g.measured)
		if !g.met && g.why != "" {
			fmt.Fprintf(&b, ": %s", g.why)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// ratios formats kernelgate/direct and kernelgate/Jupyter Server of
// p50s, with the paired difference against direct when given.
func ratios(kg, direct, js sample, withPaired bool) string {
	var parts []string
	if len(kg) > 0 && len(direct) > 0 {
		s := "kg/direct " + ratio(ms(kg.p50()), ms(direct.p50()))
		if withPaired {
			s += " (paired " + fmtDiff(paired(kg, direct)) + ")"
		}
		parts = append(parts, s)
	}
	if len(kg) > 0 && len(js) > 0 {
		parts = append(parts, "kg/JS "+ratio(ms(kg.p50()), ms(js.p50())))
	}
	return strings.Join(parts, "; ")
}

// machine describes where and when the figures were taken.
type machine struct {
	date, cpu, mem, os, kernel, goVersion, versions, commit, loadStart, loadEnd string
	took                                                                        time.Duration

	mu            sync.Mutex
	loadMin, load float64 // the 1-minute load average: lowest and highest sampled
	samples       int
}

// sampleLoad samples the 1-minute load average every 10 s until ctx ends.
func (m *machine) sampleLoad(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		var l float64
		if b, err := os.ReadFile("/proc/loadavg"); err == nil {
			fmt.Sscanf(string(b), "%f", &l)
			m.mu.Lock()
			if m.samples == 0 || l < m.loadMin {
				m.loadMin = l
			}
			m.load = max(m.load, l)
			m.samples++
			m.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func describeMachine(ctx context.Context) *machine {
	m := &machine{date: time.Now().UTC().Format("2006-01-02 15:04 UTC"), goVersion: runtime.Version(), loadStart: loadAvg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	m.cpu = fmt.Sprintf("%d × %s", runtime.NumCPU(), m.cpu)
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		fmt.Sscanf(strings.TrimPrefix(strings.SplitN(string(b), "\n", 2)[0], "MemTotal:"), "%d", &kb)
		m.mem = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				m.os = strings.Trim(v, `"`)
			}
		}
		if v, err := os.ReadFile("/etc/debian_version"); err == nil {
			m.os += " (" + strings.TrimSpace(string(v)) + ")"
		}
	}
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		var s []byte
		for _, c := range u.Release {
			if c == 0 {
				break
			}
			s = append(s, byte(c))
		}
		m.kernel = "Linux " + string(s)
	}
	out := func(name string, args ...string) string {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		b, err := exec.CommandContext(cctx, name, args...).Output()
		if err != nil {
			return "?"
		}
		return strings.TrimSpace(string(b))
	}
	py := out("/usr/bin/python3", "-c", "import sys, ipykernel, jupyter_client, zmq, jupyter_server, tornado; "+
		"print('Python %d.%d.%d' % sys.version_info[:3], 'ipykernel', ipykernel.__version__, 'jupyter_client', jupyter_client.__version__, "+
		"'pyzmq', zmq.__version__, 'jupyter_server', jupyter_server.__version__, 'tornado', tornado.version)")
	deno := "?"
	if spec, err := kernelspecsDeno(); err == nil {
		deno = strings.SplitN(out(spec, "--version"), "\n", 2)[0]
	}
	m.versions = fmt.Sprintf("%s; %s; %s", out(kernelgateBin, "version"), py, deno)
	m.commit = out("git", "rev-parse", "--short", "HEAD")
	if out("git", "status", "--porcelain", "--untracked-files=no") != "" {
		m.commit += " with uncommitted changes"
	}
	return m
}

// kernelspecsDeno returns the deno program of the deno kernelspec.
func kernelspecsDeno() (string, error) {
	b, err := os.ReadFile(specDir + "/deno/kernel.json")
	if err != nil {
		return "", err
	}
	_, rest, ok := bytes.Cut(b, []byte(`"argv": ["`))
	if !ok {
		return "", fmt.Errorf("no argv")
	}
	prog, _, _ := bytes.Cut(rest, []byte(`"`))
	return string(prog), nil
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func (m *machine) markdown() string {
	m.mu.Lock()
	load := fmt.Sprintf("Load average %s at the start and %s at the end; the 1-minute figure, sampled every 10 s, ranged %.2f–%.2f",
		m.loadStart, m.loadEnd, m.loadMin, m.load)
	m.mu.Unlock()
	if m.load > 1.5 {
		load += " (other work shared the machine)"
	}
	return fmt.Sprintf("**Run.** %s, tree at %s; the harness took %v. %s.\n\n"+
		"**Machine.** %s, %s, %s, %s; %s.\n\n"+
		"**Software.** %s.\n",
		m.date, m.commit, m.took.Round(time.Second), load,
		m.cpu, m.mem, m.os, m.kernel, m.goVersion, m.versions)
}

const (
	beginMarker = "<!-- bench:begin (written by make bench; edit the text around it) -->"
	endMarker   = "<!-- bench:end -->"
)

// writeDoc replaces what lies between the markers in path with text.
func writeDoc(path, text string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	i := strings.Index(s, beginMarker)
	j := strings.Index(s, endMarker)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %q … %q markers", path, beginMarker, endMarker)
	}
	s = s[:i+len(beginMarker)] + "\n" + text + "\n" + s[j:]
	return os.WriteFile(path, []byte(s), 0o644)
}

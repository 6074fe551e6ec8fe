package main

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"kernelgate/gateway"
	"kernelgate/sessions"
)

// --help shows each flag's default, and it is the default the gateway
// runs with when the flag is not given: what sessions and gateway fill in
// for a value left zero.
func TestHelpShowsTheDefaults(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"--help"}, &out, &out); code != 0 {
		t.Fatalf("exit %d", code)
	}
	help := out.String()
	s, g := sessions.DefaultConfig(), gateway.DefaultConfig()
	for flag, want := range map[string]string{
		"default-kernel":    s.DefaultKernel,
		"cull-interval":     s.CullInterval.String(),
		"start-timeout":     s.StartTimeout.String(),
		"heartbeat-timeout": s.HeartbeatTimeout.String(),
		"heartbeat-period":  s.HeartbeatPeriod.String(),
		"pool-size":         strconv.Itoa(s.PoolSize),
		"pool-max":          strconv.Itoa(s.PoolMax),
		"pool-idle":         s.PoolIdle.String(),
		"queue-limit":       strconv.Itoa(s.QueueLimit),
		"max-log-bytes":     strconv.Itoa(s.RunLimits.LogBytes),
		"max-result-bytes":  strconv.Itoa(s.RunLimits.ResultBytes),
		"run-retention":     s.RunRetention.String(),
		"runs-kept":         strconv.Itoa(s.RunsKept),
		"interrupt-grace":   s.InterruptGrace.String(),
		"late-output-wait":  s.LateOutputWait.String(),
		"max-body":          strconv.FormatInt(g.MaxBodyBytes, 10),
		"max-frame":         strconv.FormatInt(g.MaxFrameBytes, 10),
		"max-upload":        "1GiB",
		"base-url":          g.BaseURL,
	} {
		line := "--" + flag + "  ["
		i := strings.Index(help, line)
		if i < 0 {
			t.Errorf("--help lacks --%s", flag)
			continue
		}
		got, _, _ := strings.Cut(help[i:], "\n")
		if !strings.HasSuffix(got, "(default "+want+")") {
			t.Errorf("--help: %q; want the default %s", got, want)
		}
	}
	if g.MaxUploadBytes != 1<<30 {
		t.Errorf("the gateway's default upload limit is %d, --help says 1GiB", g.MaxUploadBytes)
	}
	for lang, spec := range s.Languages {
		if !strings.Contains(help, lang+"="+spec) {
			t.Errorf("--help of --language lacks the default %s=%s", lang, spec)
		}
	}

	// Parsed without flags, the values are the defaults.
	c, err := parseConfig(nil, func(string) string { return "" }, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.CullInterval != s.CullInterval || c.PoolMax != s.PoolMax || c.MaxBody != g.MaxBodyBytes || c.MaxFrame != g.MaxFrameBytes || c.LateOutputWait != s.LateOutputWait {
		t.Errorf("parsed defaults %+v differ from the packages' defaults", c)
	}
}

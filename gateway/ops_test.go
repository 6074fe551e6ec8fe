package gateway

import (
	"bytes"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"kernelgate/sessions"
)

// metricValue reads one sample of a scrape, or 0 when absent.
func metricValue(t *testing.T, scrape, name string, labels ...string) float64 {
	t.Helper()
	for _, line := range strings.Split(scrape, "\n") {
		if !strings.HasPrefix(line, name) || strings.HasPrefix(line, "#") {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(rest, l)
		}
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("bad sample %q", line)
		}
		return v
	}
	return 0
}

func TestMetrics(t *testing.T) {
	g := newGateway(t, func(m *sessions.Config, _ *Config) { m.PoolSize = 1 })
	scrape := func() string {
		status, body := g.do("GET", "/metrics", nil)
		if status != 200 {
			t.Fatalf("/metrics: %d", status)
		}
		return string(body)
	}
	before := scrape()
	for i := 0; i < 3; i++ {
		g.run(map[string]any{"code": "1+1"})
	}
	g.run(map[string]any{"code": "1/0"})
	g.run(map[string]any{"code": "print('x' * 100)", "isolated": true})
	k := g.startKernel("python3")
	c := g.mustDial(k.ID, true)
	c.run("1+1")
	after := scrape()

	checks := []struct {
		name   string
		labels []string
		grew   float64
	}{
		{"kernelgate_executes_total", []string{`language="python"`, `reason="completed"`}, 4},
		{"kernelgate_executes_total", []string{`language="python"`, `reason="error"`}, 1},
		{"kernelgate_execute_seconds_count", []string{`language="python"`}, 5},
		{"kernelgate_kernel_starts_total", []string{`spec="python3"`}, 3},
		{"kernelgate_kernel_start_seconds_count", []string{`spec="python3"`}, 3},
		{"kernelgate_pool_takes_total", []string{`spec="python3"`}, 1},
		{"kernelgate_websocket_messages_total", []string{`direction="to_kernel"`}, 1},
		{"kernelgate_websocket_messages_total", []string{`direction="to_client"`}, 4},
		{"kernelgate_http_requests_total", []string{`route="/api/execute"`, `code="200"`}, 5},
	}
	for _, ch := range checks {
		if d := metricValue(t, after, ch.name, ch.labels...) - metricValue(t, before, ch.name, ch.labels...); d < ch.grew {
			t.Errorf("%s%v grew by %v, want at least %v", ch.name, ch.labels, d, ch.grew)
		}
	}
	if v := metricValue(t, after, "kernelgate_websocket_connections"); v != 1 {
		t.Errorf("websocket connections %v", v)
	}
	if v := metricValue(t, after, "kernelgate_kernels", `state="idle"`); v < 2 {
		t.Errorf("idle kernels %v", v)
	}
	if !strings.Contains(after, "go_goroutines") || !strings.Contains(after, "process_resident_memory_bytes") {
		t.Error("runtime collectors missing")
	}
	// No ids as labels: the label values are bounded sets.
	uuid := regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-`)
	if m := uuid.FindString(after); m != "" {
		t.Errorf("an id appears in the metrics: %s", m)
	}
	// Guarded by the API's auth.
	if status, _ := g.doWith("GET", "/metrics", nil, nil); status != 401 {
		t.Errorf("/metrics without credentials: %d", status)
	}
}

func TestHealth(t *testing.T) {
	g := newGateway(t)
	for _, p := range []string{"/healthz", "/readyz"} {
		if status, body := g.doWith("GET", p, nil, nil); status != 200 {
			t.Errorf("%s: %d %s", p, status, body)
		}
	}
	bad := newGateway(t, func(m *sessions.Config, _ *Config) {
		m.Languages = map[string]string{"python": "nonexistent"}
		m.DefaultKernel = "nonexistent"
	})
	status, body := bad.doWith("GET", "/readyz", nil, nil)
	if status != 503 || !strings.Contains(string(body), "nonexistent") {
		t.Errorf("/readyz with a missing kernelspec: %d %s", status, body)
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestLogsHoldNoSecrets(t *testing.T) {
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	g := newGateway(t, func(_ *sessions.Config, c *Config) { c.testLogger = log })
	const secretCode = "print('the-code-is-private')"
	g.doWith("GET", "/api/kernels?token="+testToken+"&q=query-is-private", nil, map[string]string{"Authorization": "token " + testToken})
	g.doWith("GET", "/api/kernels?token=wrong-token-in-url", nil, nil)
	g.doWith("GET", "/api/status", nil, map[string]string{"Authorization": "Bearer wrong-token-in-header"})
	g.run(map[string]any{"code": secretCode})
	g.doWith("POST", "/api/execute", `{"code": "`+testToken+`", "env": {"A": 1}}`, map[string]string{"Authorization": "token " + testToken, "Content-Type": "application/json"})
	k := g.startKernel("python3")
	if c, _, err := g.dialURL(k.ID, "?token="+testToken+"&session_id=s", nil); err == nil {
		c.Close()
	}
	out := logs.String()
	for _, secret := range []string{testToken, "wrong-token-in-url", "wrong-token-in-header", "query-is-private", "the-code-is-private", "token="} {
		if strings.Contains(out, secret) {
			t.Errorf("logs contain %q:\n%s", secret, out)
		}
	}
	if !strings.Contains(out, "route=/api/kernels") || !strings.Contains(out, "status=401") {
		t.Errorf("request lines missing:\n%s", out)
	}
	_ = http.StatusOK
}

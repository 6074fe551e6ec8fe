package gateway

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"kernelgate/sessions"
)

// gatedLog is a slog.Handler whose request lines wait until the gate
// opens, and which keeps them.
type gatedLog struct {
	gate    chan struct{}
	mu      sync.Mutex
	records []map[string]any
}

func (h *gatedLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *gatedLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *gatedLog) WithGroup(string) slog.Handler            { return h }

func (h *gatedLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "request" {
		return nil
	}
	select {
	case <-h.gate:
	case <-time.After(30 * time.Second): // a test that failed does not leave it waiting
	}
	rec := map[string]any{}
	r.Attrs(func(a slog.Attr) bool {
		rec[a.Key] = a.Value.Any()
		return true
	})
	h.mu.Lock()
	h.records = append(h.records, rec)
	h.mu.Unlock()
	return nil
}

// lines returns the request lines of route.
func (h *gatedLog) lines(route string) []map[string]any {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]any
	for _, r := range h.records {
		if r["route"] == route {
			out = append(out, r)
		}
	}
	return out
}

// The line of a request is written after its response reached the
// client: a client has its whole answer while the log is still busy, on
// a connection kept alive or closed after the answer, and the line still
// says status, size and duration. A websocket's request gets its line
// too.
func TestRequestLineWrittenAfterTheResponse(t *testing.T) {
	h := &gatedLog{gate: make(chan struct{})}
	g := newGateway(t, func(_ *sessions.Config, c *Config) { c.testLogger = slog.New(h) })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.srv.Serve(l)
	g.url = "http://" + l.Addr().String()

	var sizes []int
	for _, closeConn := range []bool{false, true} {
		// A connection of its own: the line of the first request holds
		// its connection's goroutine until the gate opens.
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}
		req, _ := http.NewRequest("GET", g.url+"/api/kernelspecs", nil)
		req.Header.Set("Authorization", "token "+testToken)
		req.Close = closeConn
		resp, err := client.Do(req)
		if err != nil {
			close(h.gate)
			t.Fatalf("no answer within 5 s while the request's line waited on the log (connection close %v): %v", closeConn, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			close(h.gate)
			t.Fatalf("GET /api/kernelspecs: %d, %v", resp.StatusCode, err)
		}
		sizes = append(sizes, len(body))
	}
	close(h.gate)
	route := "/api/kernelspecs"
	eventually(t, 10*time.Second, func() bool { return len(h.lines(route)) == 2 })
	for i, line := range h.lines(route) {
		if line["method"] != "GET" || line["status"] != int64(http.StatusOK) || line["size"] != int64(sizes[i]) {
			t.Errorf("line %d: %v; want GET, 200, size %d", i, line, sizes[i])
		}
		if took, ok := line["took"].(time.Duration); !ok || took <= 0 {
			t.Errorf("line %d: took %v", i, line["took"])
		}
	}

	k := g.startKernel("python3")
	ws := g.mustDial(k.ID, true)
	ws.conn.Close()
	eventually(t, 10*time.Second, func() bool { return len(h.lines("/api/kernels/:id/channels")) == 1 })
	if line := h.lines("/api/kernels/:id/channels")[0]; line["status"] != int64(http.StatusSwitchingProtocols) {
		t.Errorf("websocket line: %v", line)
	}
}

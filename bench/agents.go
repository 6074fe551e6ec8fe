//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// benchAgents measures `1+1` in a Python context through the doors agents
// use, against POST /api/execute on the same gateway: an MCP tools/call of
// run_code (Streamable HTTP, the JSON-RPC request and its SSE answer) and
// the request E2B's runCode sends to /e2b/execute (its NDJSON read to the
// end). Each system has a context of its own and a keep-alive connection
// written and read on the caller's goroutine (as restConn), one request of
// each system in turn, in a new order every turn.
func (b *bench) benchAgents(ctx context.Context) error {
	sctx, cancel := within(ctx, 10*time.Minute)
	defer cancel()
	s := b.kg
	rest, closeREST, err := restSystem(sctx, s, "python")
	if err != nil {
		return err
	}
	defer closeREST()

	// MCP: run_code in a context made over REST.
	id, _, err := s.createContext(sctx, "python")
	if err != nil {
		return err
	}
	defer s.deleteContext(context.Background(), id)
	mcpConn, err := newPostConn(s)
	if err != nil {
		return err
	}
	defer mcpConn.Close()
	call, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": "run_code", "arguments": map[string]any{"code": "1+1", "context": id}}})
	mcpHeaders := map[string]string{"Authorization": "Bearer " + s.token, "Accept": "application/json, text/event-stream",
		"Mcp-Protocol-Version": "2025-06-18"}
	mcp := &rtSystem{runs: []func(context.Context) (outcome, error){func(ctx context.Context) (outcome, error) {
		status, body, err := mcpConn.post(ctx, "/mcp", mcpHeaders, call)
		if err != nil {
			return outcome{}, err
		}
		return mcpOutcome(status, body)
	}}}

	// E2B: a sandbox, and runCode's request to its default context.
	sb, err := createSandbox(sctx, s)
	if err != nil {
		return err
	}
	defer killSandbox(s, sb.ID)
	e2bConn, err := newPostConn(s)
	if err != nil {
		return err
	}
	defer e2bConn.Close()
	e2bHeaders := map[string]string{"E2b-Sandbox-Id": sb.ID, "E2b-Sandbox-Port": "49999", "X-Access-Token": sb.Token}
	e2bBody := []byte(`{"code":"1+1"}`)
	e2b := &rtSystem{runs: []func(context.Context) (outcome, error){func(ctx context.Context) (outcome, error) {
		status, body, err := e2bConn.post(ctx, "/e2b/execute", e2bHeaders, e2bBody)
		if err != nil {
			return outcome{}, err
		}
		return e2bOutcome(status, body)
	}}}

	systems := []*rtSystem{rest, mcp, e2b}
	progress("agents: %d warm-up round trips each", b.opt.warmup)
	for range b.opt.warmup {
		for _, sys := range systems {
			if err := sys.step(sctx); err != nil {
				return err
			}
		}
	}
	for _, sys := range systems {
		sys.lat, sys.late = nil, 0
	}
	order := rand.New(rand.NewPCG(2, uint64(len(systems))))
	for i := range b.opt.roundTrips {
		if i%100 == 0 {
			progress("agents: round trip %d of %d", i, b.opt.roundTrips)
		}
		for _, j := range order.Perm(len(systems)) {
			if err := systems[j].step(sctx); err != nil {
				return err
			}
		}
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }
	pair := func(sys *rtSystem) string { return ms(sys.lat.p50()) + " / " + ms(sys.lat.p90()) }
	for _, r := range []struct {
		name string
		sys  *rtSystem
	}{{"MCP run_code (POST /mcp)", mcp}, {"E2B runCode (POST /e2b/execute)", e2b}} {
		b.add(row{
			figure: "agents: python `1+1`, " + r.name + " vs POST /api/execute, ms p50 / p90",
			kg:     pair(r.sys), direct: pair(rest) + " (REST)",
			ratios: fmt.Sprintf("p50 %.2f× REST (%+.2f ms)", float64(r.sys.lat.p50())/float64(rest.lat.p50()), float64((r.sys.lat.p50()-rest.lat.p50()).Microseconds())/1000),
		})
	}
	return nil
}

// mcpOutcome reads a tools/call answer: JSON, or one SSE message.
func mcpOutcome(status int, body []byte) (outcome, error) {
	if status != http.StatusOK {
		return outcome{}, fmt.Errorf("POST /mcp: %d %s", status, body)
	}
	if i := bytes.Index(body, []byte("data: ")); i >= 0 {
		body = body[i+len("data: "):]
		if j := bytes.IndexByte(body, '\n'); j >= 0 {
			body = body[:j]
		}
	}
	var msg struct {
		Result struct {
			IsError           bool `json:"isError"`
			StructuredContent struct {
				Results []struct {
					Text string `json:"text"`
				} `json:"results"`
			} `json:"structuredContent"`
		} `json:"result"`
		Error *struct{ Message string } `json:"error"`
	}
	if err := json.Unmarshal(body, &msg); err != nil {
		return outcome{}, fmt.Errorf("POST /mcp: %w: %s", err, body)
	}
	if msg.Error != nil || msg.Result.IsError {
		return outcome{}, fmt.Errorf("POST /mcp: %s", body)
	}
	o := outcome{status: "ok"}
	if rs := msg.Result.StructuredContent.Results; len(rs) > 0 {
		o.text = rs[0].Text
	}
	return o, nil
}

// e2bOutcome reads E2B's NDJSON to its end.
func e2bOutcome(status int, body []byte) (outcome, error) {
	if status != http.StatusOK {
		return outcome{}, fmt.Errorf("POST /e2b/execute: %d %s", status, body)
	}
	o := outcome{}
	for _, line := range strings.Split(strings.TrimSpace(string(body)), "\n") {
		var ev struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			return outcome{}, fmt.Errorf("POST /e2b/execute: %w: %s", err, line)
		}
		switch ev.Type {
		case "result":
			o.text = ev.Text
		case "error":
			return outcome{}, fmt.Errorf("POST /e2b/execute: %s", line)
		case "end_of_execution":
			o.status = "ok"
		}
	}
	if o.status != "ok" {
		return outcome{}, fmt.Errorf("POST /e2b/execute: no end_of_execution in %s", body)
	}
	return o, nil
}

// sandboxInfo is what POST /e2b/sandboxes answers, as far as used here.
type sandboxInfo struct {
	ID    string `json:"sandboxID"`
	Token string `json:"envdAccessToken"`
}

func createSandbox(ctx context.Context, s *server) (sandboxInfo, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", s.url+"e2b/sandboxes", strings.NewReader(`{"templateID":"code-interpreter-v1","timeout":3600}`))
	if err != nil {
		return sandboxInfo{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-API-KEY", s.token)
	resp, err := s.http.Do(req)
	if err != nil {
		return sandboxInfo{}, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return sandboxInfo{}, fmt.Errorf("POST /e2b/sandboxes: %d %s", resp.StatusCode, body)
	}
	var sb sandboxInfo
	return sb, json.Unmarshal(body, &sb)
}

func killSandbox(s *server, id string) {
	req, err := http.NewRequest("DELETE", s.url+"e2b/sandboxes/"+id, nil)
	if err != nil {
		return
	}
	req.Header.Set("X-API-KEY", s.token)
	if resp, err := s.http.Do(req); err == nil {
		resp.Body.Close()
	}
}

// postConn POSTs on one keep-alive connection, written and read on the
// caller's goroutine, as restConn does.
type postConn struct {
	s    *server
	host string
	conn net.Conn
	br   *bufio.Reader
}

func newPostConn(s *server) (*postConn, error) {
	u, err := url.Parse(s.url)
	if err != nil {
		return nil, err
	}
	return &postConn{s: s, host: u.Host}, nil
}

func (c *postConn) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

func (c *postConn) post(ctx context.Context, path string, headers map[string]string, body []byte) (int, []byte, error) {
	if c.conn == nil {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", c.host)
		if err != nil {
			return 0, nil, fmt.Errorf("%s POST %s: %w", c.s.name, path, err)
		}
		c.conn, c.br = conn, bufio.NewReader(conn)
	}
	dl, _ := ctx.Deadline()
	c.conn.SetDeadline(dl)
	var b bytes.Buffer
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", path, c.host, len(body))
	for k, v := range headers {
		fmt.Fprintf(&b, "%s: %s\r\n", k, v)
	}
	b.WriteString("\r\n")
	b.Write(body)
	if _, err := c.conn.Write(b.Bytes()); err != nil {
		return 0, nil, fmt.Errorf("%s POST %s: %w", c.s.name, path, err)
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("%s POST %s: %w", c.s.name, path, err)
	}
	out, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, nil, fmt.Errorf("%s POST %s: %w", c.s.name, path, err)
	}
	return resp.StatusCode, out, nil
}

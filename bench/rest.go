//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"kernelgate/runs"
)

// do sends a request with the server's token and returns status and body.
func (s *server) do(ctx context.Context, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		js, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "token "+s.token)
	resp, err := s.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// expect sends a request and fails unless the status is want; it decodes
// the body into v when v is not nil.
func (s *server) expect(ctx context.Context, want int, method, path string, body, v any) error {
	status, out, err := s.do(ctx, method, path, body)
	if err != nil {
		return fmt.Errorf("%s %s %s: %w", s.name, method, path, err)
	}
	if status != want {
		return fmt.Errorf("%s %s %s: status %d, want %d: %.300s", s.name, method, path, status, want, out)
	}
	if v != nil {
		if err := json.Unmarshal(out, v); err != nil {
			return fmt.Errorf("%s %s %s: %w", s.name, method, path, err)
		}
	}
	return nil
}

// startKernel is POST /api/kernels; it returns the kernel id.
func (s *server) startKernel(ctx context.Context, spec string) (string, error) {
	var k struct {
		ID string `json:"id"`
	}
	if err := s.expect(ctx, http.StatusCreated, "POST", "api/kernels", map[string]string{"name": spec}, &k); err != nil {
		return "", err
	}
	return k.ID, nil
}

func (s *server) deleteKernel(ctx context.Context, id string) error {
	return s.expect(ctx, http.StatusNoContent, "DELETE", "api/kernels/"+id, nil, nil)
}

// execution is what the harness reads of an Execution.
type execution struct {
	Results []struct {
		Text string `json:"text"`
	} `json:"results"`
	Logs struct {
		Stdout []string `json:"stdout"`
	} `json:"logs"`
	Process struct {
		Reason string `json:"reason"`
	} `json:"process"`
}

// execute is POST /api/execute. It returns an error for a non-200
// answer, a run that did not complete, or a result other than want (ANSI
// colours stripped); missing reports a run that completed without any
// result (Deno publishes some results after idle, see --late-output-wait).
func (s *server) execute(ctx context.Context, body map[string]any, want string) (missing bool, err error) {
	status, out, err := s.do(ctx, "POST", "api/execute", body)
	if err != nil {
		return false, err
	}
	return checkExecution(status, out, want)
}

// checkExecution reads the answer of POST /api/execute as execute does.
func checkExecution(status int, out []byte, want string) (missing bool, err error) {
	if status != http.StatusOK {
		return false, fmt.Errorf("POST /api/execute: status %d: %.300s", status, out)
	}
	var e execution
	if err := json.Unmarshal(out, &e); err != nil {
		return false, fmt.Errorf("POST /api/execute: %w", err)
	}
	if e.Process.Reason != "completed" {
		return false, fmt.Errorf("POST /api/execute: run ended %q: %.300s", e.Process.Reason, out)
	}
	if len(e.Results) == 0 {
		return true, nil
	}
	if got := runs.StripANSI(e.Results[0].Text); got != want {
		return false, fmt.Errorf("POST /api/execute: %w: %q, want %q", errWrong, got, want)
	}
	return false, nil
}

// createContext is POST /api/contexts; it returns the context's id and
// its kernel's id.
func (s *server) createContext(ctx context.Context, language string) (id, kernel string, err error) {
	var c struct {
		ID       string `json:"id"`
		KernelID string `json:"kernelId"`
	}
	err = s.expect(ctx, http.StatusCreated, "POST", "api/contexts", map[string]string{"language": language}, &c)
	return c.ID, c.KernelID, err
}

func (s *server) deleteContext(ctx context.Context, id string) error {
	return s.expect(ctx, http.StatusNoContent, "DELETE", "api/contexts/"+id, nil, nil)
}

// metrics scrapes /metrics and returns the value of each series, keyed
// by its name with labels as printed (go_goroutines,
// kernelgate_pool_ready_kernels{spec="python3"}).
func (s *server) metrics(ctx context.Context) (map[string]float64, error) {
	status, out, err := s.do(ctx, "GET", "metrics", nil)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: status %d", status)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, nil
}

// goroutines is the gateway's go_goroutines.
func (s *server) goroutines(ctx context.Context) (int, error) {
	m, err := s.metrics(ctx)
	if err != nil {
		return 0, err
	}
	return int(m["go_goroutines"]), nil
}

// waitPool waits until the warm pool of spec holds n ready kernels.
func (s *server) waitPool(ctx context.Context, spec string, n int) error {
	key := `kernelgate_pool_ready_kernels{spec="` + spec + `"}`
	for {
		m, err := s.metrics(ctx)
		if err == nil && int(m[key]) >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: warm pool of %s not filled: %w", s.name, spec, ctx.Err())
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// restConn is a minimal HTTP/1.1 client on one keep-alive connection, for
// the REST round trips: it writes the request and reads the answer on the
// caller's goroutine. Go's http.Transport hands every request to a writer
// and a reader goroutine of its own, which costs about 0.25 ms a request
// on this machine (GET /api: 0.47 against 0.22 ms p50), more than the
// budgets the round trips are held to; clients such as curl or Python's
// http.client do not pay it, and it is no part of the gateway.
type restConn struct {
	s    *server
	host string
	conn net.Conn
	br   *bufio.Reader
}

// newRESTConn makes a restConn for s. It connects on its first request:
// the server closes a connection that sends no request within its
// ReadHeaderTimeout (10 s), and setting up the other systems takes longer.
func newRESTConn(s *server) (*restConn, error) {
	u, err := url.Parse(s.url)
	if err != nil {
		return nil, err
	}
	return &restConn{s: s, host: u.Host}, nil
}

func (c *restConn) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// execute is POST /api/execute of body, checked as server.execute does.
func (c *restConn) execute(ctx context.Context, body []byte, want string) (missing bool, err error) {
	if c.conn == nil {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", c.host)
		if err != nil {
			return false, fmt.Errorf("%s POST /api/execute: %w", c.s.name, err)
		}
		c.conn, c.br = conn, bufio.NewReader(conn)
	}
	dl, _ := ctx.Deadline() // zero: none
	c.conn.SetDeadline(dl)
	var b bytes.Buffer
	fmt.Fprintf(&b, "POST /api/execute HTTP/1.1\r\nHost: %s\r\nAuthorization: token %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", c.host, c.s.token, len(body))
	b.Write(body)
	if _, err := c.conn.Write(b.Bytes()); err != nil {
		return false, fmt.Errorf("%s POST /api/execute: %w", c.s.name, err)
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return false, fmt.Errorf("%s POST /api/execute: %w", c.s.name, err)
	}
	out, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return false, fmt.Errorf("%s POST /api/execute: %w", c.s.name, err)
	}
	return checkExecution(resp.StatusCode, out, want)
}

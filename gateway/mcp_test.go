package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"net/http"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"kernelgate/sessions"
)

// headerTransport adds a header to every request.
type headerTransport struct {
	key, value string
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if h.value != "" {
		r.Header.Set(h.key, h.value)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// mcpClient connects the Go SDK's client to the gateway's /mcp with the
// Authorization header auth ("" for none).
func mcpClient(t *testing.T, g *testGateway, auth string) (*sdk.ClientSession, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := sdk.NewClient(&sdk.Implementation{Name: "kernelgate-test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &sdk.StreamableClientTransport{
		Endpoint:   g.url + "/mcp",
		HTTPClient: &http.Client{Transport: headerTransport{"Authorization", auth}},
	}, nil)
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

// call calls a tool and returns its result.
func call(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) *sdk.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

// texts joins a result's text content.
func texts(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
			b.WriteString("\n")
		}
	}
	return b.String()
}

// structured decodes a result's structured content.
func structured[T any](t *testing.T, res *sdk.CallToolResult) T {
	t.Helper()
	js, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	return decode[T](t, js)
}

func TestMCPTools(t *testing.T) {
	g := newGateway(t)
	cs, err := mcpClient(t, g, "Bearer "+g.token)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, tool := range list.Tools {
		names[tool.Name] = true
		if len(tool.Description) < 40 {
			t.Errorf("tool %s: description %q too thin for a model", tool.Name, tool.Description)
		}
	}
	for _, want := range []string{"run_code", "create_context", "list_contexts", "delete_context", "interrupt", "write_file", "read_file", "list_files"} {
		if !names[want] {
			t.Errorf("tool %s not listed (got %v)", want, names)
		}
	}

	t.Run("state kept in a context", func(t *testing.T) {
		res := call(t, cs, "create_context", map[string]any{"id": "mcp-state"})
		if res.IsError {
			t.Fatalf("create_context: %s", texts(res))
		}
		if m := structured[map[string]any](t, res); m["id"] != "mcp-state" || m["language"] != "python" {
			t.Fatalf("create_context structured = %v", m)
		}
		call(t, cs, "run_code", map[string]any{"code": "x = 20", "context": "mcp-state"})
		// Another client (a new connection) continues the same context.
		cs2, err := mcpClient(t, g, "Bearer "+g.token)
		if err != nil {
			t.Fatal(err)
		}
		res = call(t, cs2, "run_code", map[string]any{"code": "print('hi'); x * 2 + 2", "context": "mcp-state"})
		if res.IsError {
			t.Fatalf("run_code: %s", texts(res))
		}
		if got := texts(res); !strings.Contains(got, "hi\n") || !strings.Contains(got, "42") {
			t.Fatalf("run_code text = %q, want stdout hi and result 42", got)
		}
		exec := structured[map[string]any](t, res)
		if exec["context"] != "mcp-state" || exec["executionCount"] != float64(2) {
			t.Fatalf("structured Execution = %v", exec)
		}
		res = call(t, cs, "list_contexts", nil)
		if !strings.Contains(texts(res), "mcp-state") {
			t.Fatalf("list_contexts = %s", texts(res))
		}
		res = call(t, cs, "delete_context", map[string]any{"context": "mcp-state"})
		if res.IsError {
			t.Fatalf("delete_context: %s", texts(res))
		}
		res = call(t, cs, "run_code", map[string]any{"code": "x", "context": "mcp-state"})
		if !res.IsError || !strings.HasPrefix(texts(res), "SESSION_NOT_FOUND:") {
			t.Fatalf("run in a deleted context = %v %q, want SESSION_NOT_FOUND", res.IsError, texts(res))
		}
	})

	t.Run("files", func(t *testing.T) {
		if res := call(t, cs, "create_context", map[string]any{"id": "mcp-files"}); res.IsError {
			t.Fatal(texts(res))
		}
		res := call(t, cs, "write_file", map[string]any{"context": "mcp-files", "path": "data/sales.csv", "content": "month,total\njan,10\nfeb,32\n"})
		if res.IsError {
			t.Fatalf("write_file: %s", texts(res))
		}
		res = call(t, cs, "run_code", map[string]any{"context": "mcp-files", "code": "import pandas as pd\nimport matplotlib\nmatplotlib.use('agg')\nimport matplotlib.pyplot as plt\n" +
			"df = pd.read_csv('data/sales.csv')\ndf.plot(x='month', y='total').get_figure().savefig('plot.png')\nopen('sum.txt', 'w').write(str(df.total.sum()))\nint(df.total.sum())"})
		if res.IsError || !strings.Contains(texts(res), "42") {
			t.Fatalf("code reading the written file: %v %s", res.IsError, texts(res))
		}
		res = call(t, cs, "list_files", map[string]any{"context": "mcp-files"})
		if got := texts(res); !strings.Contains(got, "plot.png") || !strings.Contains(got, "sum.txt") || !strings.Contains(got, "data/") {
			t.Fatalf("list_files = %q", got)
		}
		res = call(t, cs, "read_file", map[string]any{"context": "mcp-files", "path": "sum.txt"})
		if res.IsError || texts(res) != "42\n" {
			t.Fatalf("read_file sum.txt = %v %q", res.IsError, texts(res))
		}
		res = call(t, cs, "read_file", map[string]any{"context": "mcp-files", "path": "plot.png"})
		if len(res.Content) != 1 {
			t.Fatalf("read_file plot.png: %+v", res.Content)
		}
		if img, ok := res.Content[0].(*sdk.ImageContent); !ok || img.MIMEType != "image/png" || !bytes.HasPrefix(img.Data, []byte("\x89PNG")) {
			t.Fatalf("read_file plot.png is not a PNG image: %+v", res.Content[0])
		}
		res = call(t, cs, "write_file", map[string]any{"context": "mcp-files", "path": "blob.bin", "contentBase64": "AAEC/w=="})
		if res.IsError {
			t.Fatal(texts(res))
		}
		if res = call(t, cs, "read_file", map[string]any{"context": "mcp-files", "path": "blob.bin"}); texts(res) != "AAEC/w==\n" {
			t.Fatalf("binary read_file = %q, want base64", texts(res))
		}
		for _, c := range []struct{ path, code string }{{"../escape.txt", "BAD_REQUEST:"}, {"/etc/passwd", "BAD_REQUEST:"}, {"missing.txt", "NOT_FOUND:"}} {
			if res := call(t, cs, "read_file", map[string]any{"context": "mcp-files", "path": c.path}); !res.IsError || !strings.HasPrefix(texts(res), c.code) {
				t.Errorf("read_file %s = %q, want %s", c.path, texts(res), c.code)
			}
		}
		if res := call(t, cs, "write_file", map[string]any{"context": "mcp-files", "path": "../x", "content": "no"}); !res.IsError || !strings.HasPrefix(texts(res), "BAD_REQUEST:") {
			t.Errorf("write_file ../x = %q, want BAD_REQUEST", texts(res))
		}
	})

	t.Run("errors named", func(t *testing.T) {
		res := call(t, cs, "run_code", map[string]any{"code": "1/0"})
		if !res.IsError || !strings.Contains(texts(res), "ZeroDivisionError: division by zero") {
			t.Fatalf("1/0 = %v %q, want a ZeroDivisionError named", res.IsError, texts(res))
		}
		if e := structured[map[string]any](t, res)["error"].(map[string]any); e["name"] != "ZeroDivisionError" {
			t.Fatalf("structured error = %v", e)
		}
		res = call(t, cs, "run_code", map[string]any{"code": "1", "language": "cobol"})
		if !res.IsError || !strings.HasPrefix(texts(res), "BAD_REQUEST:") {
			t.Fatalf("unknown language = %q, want BAD_REQUEST", texts(res))
		}
		res = call(t, cs, "create_context", map[string]any{"packages": []string{"--index-url=https://evil.example"}})
		if !res.IsError || !strings.HasPrefix(texts(res), "BAD_REQUEST:") {
			t.Fatalf("a pip option as a package = %q, want BAD_REQUEST", texts(res))
		}
		res = call(t, cs, "run_code", map[string]any{"code": "1", "bogus": true})
		if !res.IsError || !strings.HasPrefix(texts(res), "BAD_REQUEST:") {
			t.Fatalf("unknown argument = %q, want BAD_REQUEST", texts(res))
		}
	})

	t.Run("matplotlib plot as image", func(t *testing.T) {
		res := call(t, cs, "run_code", map[string]any{"code": "import matplotlib\nmatplotlib.use('agg')\n%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()"})
		if res.IsError {
			t.Fatalf("plot: %s", texts(res))
		}
		var img *sdk.ImageContent
		for _, c := range res.Content {
			if ic, ok := c.(*sdk.ImageContent); ok {
				img = ic
			}
		}
		if img == nil || img.MIMEType != "image/png" {
			t.Fatalf("no PNG image content in %+v", res.Content)
		}
		cfg, err := png.DecodeConfig(bytes.NewReader(img.Data))
		if err != nil || cfg.Width < 100 {
			t.Fatalf("image is not a plot: %v %+v", err, cfg)
		}
	})

	t.Run("javascript on deno", func(t *testing.T) {
		res := call(t, cs, "run_code", map[string]any{"code": "const xs = [1, 2, 3]; console.log('deno', Deno.version.deno !== undefined); xs.reduce((a, b) => a + b)", "language": "javascript"})
		if res.IsError {
			t.Fatalf("javascript: %s", texts(res))
		}
		if got := texts(res); !strings.Contains(got, "deno true") || !strings.Contains(got, "6") {
			t.Fatalf("javascript text = %q", got)
		}
	})

	t.Run("timeout interrupts and keeps state", func(t *testing.T) {
		call(t, cs, "create_context", map[string]any{"id": "mcp-slow"})
		call(t, cs, "run_code", map[string]any{"code": "kept = 7", "context": "mcp-slow"})
		res := call(t, cs, "run_code", map[string]any{"code": "import time\ntime.sleep(60)", "context": "mcp-slow", "timeout": 1})
		if !res.IsError || structured[map[string]any](t, res)["process"].(map[string]any)["reason"] != "timed_out" {
			t.Fatalf("timeout = %v %q", res.IsError, texts(res))
		}
		res = call(t, cs, "run_code", map[string]any{"code": "kept", "context": "mcp-slow"})
		if !strings.Contains(texts(res), "7") {
			t.Fatalf("state after timeout = %q", texts(res))
		}
	})
}

func TestMCPAuth(t *testing.T) {
	g := newGateway(t, func(_ *sessions.Config, c *Config) {
		k, _ := ParseAPIKey("reader read reader-secret-0123456789")
		c.APIKeys = append(c.APIKeys, k)
	})
	if _, err := mcpClient(t, g, ""); err == nil {
		t.Fatal("connected without credentials")
	}
	if status, body := g.doWith("POST", "/mcp", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, map[string]string{"Accept": "application/json, text/event-stream"}); status != http.StatusUnauthorized {
		t.Fatalf("POST /mcp without credentials = %d %s, want 401", status, body)
	}
	if _, err := mcpClient(t, g, "Bearer wrong-token"); err == nil {
		t.Fatal("connected with a wrong token")
	}

	// A read key lists but does not run.
	reader, err := mcpClient(t, g, "Bearer reader-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	if res := call(t, reader, "list_contexts", nil); res.IsError {
		t.Fatalf("list_contexts with read: %s", texts(res))
	}
	if res := call(t, reader, "run_code", map[string]any{"code": "1"}); !res.IsError || !strings.HasPrefix(texts(res), "FORBIDDEN:") {
		t.Fatalf("run_code with read = %q, want FORBIDDEN", texts(res))
	}

	// A context token reaches its own context only.
	admin, err := mcpClient(t, g, "token "+g.token)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"mine", "theirs"} {
		if res := call(t, admin, "create_context", map[string]any{"id": id}); res.IsError {
			t.Fatal(texts(res))
		}
	}
	status, body := g.do("POST", "/api/contexts/mine/tokens", map[string]any{"ttl": 600})
	if status != http.StatusCreated {
		t.Fatalf("mint: %d %s", status, body)
	}
	tok := decode[map[string]string](t, body)["token"]
	cs, err := mcpClient(t, g, "Bearer "+tok)
	if err != nil {
		t.Fatal(err)
	}
	if res := call(t, cs, "run_code", map[string]any{"code": "y = 5; y"}); res.IsError || !strings.Contains(texts(res), "5") {
		t.Fatalf("context token, no context named = %v %q, want it to run in its context", res.IsError, texts(res))
	}
	if res := call(t, cs, "run_code", map[string]any{"code": "y", "context": "mine"}); res.IsError {
		t.Fatalf("context token in its context: %s", texts(res))
	}
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"run_code", map[string]any{"code": "1", "context": "theirs"}},
		{"interrupt", map[string]any{"context": "theirs"}},
		{"create_context", map[string]any{}},
		{"delete_context", map[string]any{"context": "mine"}},
		{"write_file", map[string]any{"context": "theirs", "path": "a.txt", "content": "x"}},
		{"read_file", map[string]any{"context": "theirs", "path": "a.txt"}},
		{"list_files", map[string]any{"context": "theirs"}},
	} {
		if res := call(t, cs, c.tool, c.args); !res.IsError || !strings.HasPrefix(texts(res), "FORBIDDEN:") {
			t.Errorf("context token %s %v = %q, want FORBIDDEN", c.tool, c.args, texts(res))
		}
	}
	if res := call(t, cs, "write_file", map[string]any{"context": "mine", "path": "a.txt", "content": "own"}); res.IsError {
		t.Fatalf("context token writing its own files: %s", texts(res))
	}
	if res := call(t, reader, "read_file", map[string]any{"context": "mine", "path": "a.txt"}); res.IsError || texts(res) != "own\n" {
		t.Fatalf("read key reading a file = %q", texts(res))
	}
	if res := call(t, reader, "write_file", map[string]any{"context": "mine", "path": "b.txt", "content": "no"}); !strings.HasPrefix(texts(res), "FORBIDDEN:") {
		t.Fatalf("read key writing a file = %q, want FORBIDDEN", texts(res))
	}
	res := call(t, cs, "list_contexts", nil)
	if got := texts(res); !strings.Contains(got, "mine") || strings.Contains(got, "theirs") {
		t.Fatalf("context token's list_contexts = %q, want its context only", got)
	}
}

// TestMCPCancelInterrupts: a client (of protocol 2026-07-28, as the Go
// SDK's) that cancels run_code interrupts the run; the kernel keeps its
// state and the next run does not wait behind the cancelled one.
func TestMCPCancelInterrupts(t *testing.T) {
	g := newGateway(t)
	cs, err := mcpClient(t, g, "Bearer "+g.token)
	if err != nil {
		t.Fatal(err)
	}
	if res := call(t, cs, "create_context", map[string]any{"id": "mcp-cancel"}); res.IsError {
		t.Fatal(texts(res))
	}
	call(t, cs, "run_code", map[string]any{"code": "kept = 3", "context": "mcp-cancel"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "run_code", Arguments: map[string]any{"code": "import time\ntime.sleep(120)", "context": "mcp-cancel"}})
	if err == nil {
		t.Fatal("the cancelled call returned a result")
	}
	// The run was interrupted: the next one runs at once, with the state.
	res := call(t, cs, "run_code", map[string]any{"code": "kept", "context": "mcp-cancel", "timeout": 20})
	if res.IsError || !strings.Contains(texts(res), "3") {
		t.Fatalf("after a cancelled call = %v %q, want the state and no wait", res.IsError, texts(res))
	}
}

// TestMCPInterruptTool: interrupt from another client stops a running
// run_code; the kernel keeps its state.
func TestMCPInterruptTool(t *testing.T) {
	g := newGateway(t)
	cs, err := mcpClient(t, g, "Bearer "+g.token)
	if err != nil {
		t.Fatal(err)
	}
	if res := call(t, cs, "create_context", map[string]any{"id": "mcp-int"}); res.IsError {
		t.Fatal(texts(res))
	}
	call(t, cs, "run_code", map[string]any{"code": "kept = 9", "context": "mcp-int"})
	done := make(chan *sdk.CallToolResult, 1)
	go func() {
		res, _ := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "run_code",
			Arguments: map[string]any{"code": "import time\ntime.sleep(120)", "context": "mcp-int"}})
		done <- res
	}()
	checkFor(t, 30*time.Second, "the run is busy", func() bool {
		c, err := g.mgr.Context("mcp-int")
		return err == nil && c.Model().ExecutionState == "busy"
	})
	other, err := mcpClient(t, g, "Bearer "+g.token)
	if err != nil {
		t.Fatal(err)
	}
	if res := call(t, other, "interrupt", map[string]any{"context": "mcp-int"}); res.IsError {
		t.Fatalf("interrupt: %s", texts(res))
	}
	select {
	case res := <-done:
		if res == nil || !strings.Contains(texts(res), "KeyboardInterrupt") {
			t.Fatalf("interrupted run_code = %+v", res)
		}
		if r := structured[map[string]any](t, res)["process"].(map[string]any)["reason"]; r != "interrupted" {
			t.Fatalf("reason = %v, want interrupted", r)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("run_code did not end after interrupt")
	}
	if res := call(t, cs, "run_code", map[string]any{"code": "kept", "context": "mcp-int"}); !strings.Contains(texts(res), "9") {
		t.Fatalf("state after interrupt = %q", texts(res))
	}
}

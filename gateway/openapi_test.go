package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/labstack/echo/v4"

	"kernelgate/runs"
	"kernelgate/sessions"
)

// mustOpenAPI returns the embedded document, loaded and validated.
func mustOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openAPIDoc()
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// openAPIOps lists the document's operations as "METHOD path", sorted.
func openAPIOps(doc *openapi3.T) []string {
	var out []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			out = append(out, method+" "+path)
		}
	}
	sort.Strings(out)
	return out
}

// openAPIRoute is the document's route for method and path.
func openAPIRoute(t *testing.T, doc *openapi3.T, method, path string) *routers.Route {
	t.Helper()
	item := doc.Paths.Value(path)
	if item == nil {
		t.Fatalf("openapi.yaml has no path %s", path)
	}
	op := item.GetOperation(method)
	if op == nil {
		t.Fatalf("openapi.yaml has no %s %s", method, path)
	}
	return &routers.Route{Spec: doc, Server: doc.Servers[0], Path: path, PathItem: item, Method: method, Operation: op}
}

// successStatus is the operation's documented success status: its lowest
// 1xx or 2xx response.
func successStatus(t *testing.T, op *openapi3.Operation) int {
	t.Helper()
	best := 0
	for _, k := range op.Responses.Keys() {
		n, err := strconv.Atoi(k)
		if err == nil && n < 300 && (best == 0 || n < best) {
			best = n
		}
	}
	if best == 0 {
		t.Fatalf("operation %s documents no success response", op.OperationID)
	}
	return best
}

// openAPIAuth checks the credentials of a request as the security
// schemes describe them.
func openAPIAuth(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	r := in.RequestValidationInput.Request
	switch in.SecuritySchemeName {
	case "bearer":
		if r.Header.Get("Authorization") == "Bearer "+testToken {
			return nil
		}
	case "queryToken":
		if r.URL.Query().Get("token") == testToken {
			return nil
		}
	}
	return in.NewError(errors.New("no credentials"))
}

// openAPISurface reports which error body a documented path answers with.
func openAPISurface(path string) string {
	switch {
	case path == "/healthz" || path == "/readyz" || path == "/metrics" || path == "/api/openapi.json":
		return "OpsError"
	case path == "/api/execute" || path == "/api/languages" || strings.HasPrefix(path, "/api/contexts") || path == "/api/context-tokens" || strings.HasPrefix(path, "/api/runs"):
		return "ApiError"
	}
	return "JupyterError"
}

func TestOpenAPIValidates(t *testing.T) {
	doc, err := loadOpenAPI(openapiYAML)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.0.3" || doc.Info.Title != "kernelgate" {
		t.Errorf("openapi %q, title %q", doc.OpenAPI, doc.Info.Title)
	}

	open := []string{"/api", "/healthz", "/readyz", "/api/openapi.json"}
	ids := map[string]string{}
	for _, key := range openAPIOps(doc) {
		method, path, _ := strings.Cut(key, " ")
		op := doc.Paths.Value(path).GetOperation(method)
		if op.OperationID == "" {
			t.Errorf("%s: no operationId", key)
		} else if prev, dup := ids[op.OperationID]; dup {
			t.Errorf("%s: operationId %s is also %s", key, op.OperationID, prev)
		}
		ids[op.OperationID] = key
		if len(op.Tags) == 0 {
			t.Errorf("%s: no tags", key)
		}
		successStatus(t, op)

		// Security: the open routes say so; the others need a scope.
		if slices.Contains(open, path) {
			if op.Security == nil || len(*op.Security) != 0 {
				t.Errorf("%s: want security: [] (no credentials needed)", key)
			}
		} else if scope, _ := op.Extensions["x-kernelgate-scope"].(string); scope != "read" && scope != "exec" {
			t.Errorf("%s: x-kernelgate-scope is %q, want read or exec", key, scope)
		}

		// Errors use the body of the route's surface.
		want := "#/components/schemas/" + openAPISurface(path)
		for code, ref := range op.Responses.Map() {
			if code != "default" && code < "400" || path == "/readyz" {
				continue
			}
			mt := ref.Value.Content.Get("application/json")
			if mt == nil {
				if method != http.MethodHead {
					t.Errorf("%s %s: no application/json body", key, code)
				}
				continue
			}
			if mt.Schema.Ref != want {
				t.Errorf("%s %s: error schema %s, want %s", key, code, mt.Schema.Ref, want)
			}
		}
	}

	// The code enum holds the codes of API.md §3 and every code the
	// gateway can answer with.
	codes := map[string]bool{}
	for _, v := range doc.Components.Schemas["ErrorCode"].Value.Enum {
		codes[v.(string)] = true
	}
	apiMD := []string{"BAD_REQUEST", "UNAUTHORIZED", "FORBIDDEN", "SESSION_NOT_FOUND", "NOT_FOUND", "NAME_CONFLICT",
		"UNSUPPORTED_OPERATION", "PAYLOAD_TOO_LARGE", "UNSUPPORTED_MEDIA_TYPE", "QUEUE_FULL", "RESOURCE_EXHAUSTED",
		"REQUEST_TIMEOUT", "KERNEL_START_FAILED"}
	served := []string{classify(errors.New("unexpected")).code}
	for _, row := range errorTable {
		served = append(served, row.code)
	}
	for status := 400; status < 600; status++ {
		served = append(served, codeForStatus(status))
	}
	for _, c := range append(apiMD, served...) {
		if !codes[c] {
			t.Errorf("ErrorCode lacks %s", c)
		}
	}
}

// echoPathParam matches Echo's :name path parameters.
var echoPathParam = regexp.MustCompile(`:([A-Za-z_][A-Za-z0-9_]*)`)

// openAPIPath converts an Echo route path to the document's form.
func openAPIPath(p string) string {
	p = echoPathParam.ReplaceAllString(p, "{$1}")
	if rest, ok := strings.CutSuffix(p, "/*"); ok {
		p = rest + "/{file}"
	}
	return p
}

func TestOpenAPIRouteParity(t *testing.T) {
	documented := openAPIOps(mustOpenAPI(t))
	for _, base := range []string{"/", "/kg/"} {
		t.Run("base="+strings.Trim(base, "/"), func(t *testing.T) {
			g := newGateway(t, func(_ *sessions.Config, c *Config) {
				c.BaseURL = base
				c.Web = http.NotFoundHandler()
			})
			prefix := strings.TrimSuffix(base, "/")
			var served []string
			for _, r := range g.srv.echo.Routes() {
				if r.Method == echo.RouteNotFound {
					continue
				}
				p, ok := strings.CutPrefix(r.Path, prefix)
				if !ok {
					t.Errorf("route %s %s is outside the base URL %s", r.Method, r.Path, base)
					continue
				}
				if p == "/" || p == "/static/*" { // the web front-end
					continue
				}
				if p == "/mcp" || p == "/e2b/*" { // MCP's and E2B's protocols, not this document's
					continue
				}
				served = append(served, r.Method+" "+openAPIPath(p))
			}
			sort.Strings(served)
			served = slices.Compact(served)
			for _, s := range served {
				if _, found := slices.BinarySearch(documented, s); !found {
					t.Errorf("served but not in openapi.yaml: %s", s)
				}
			}
			for _, d := range documented {
				if _, found := slices.BinarySearch(served, d); !found {
					t.Errorf("in openapi.yaml but not served: %s", d)
				}
			}
		})
	}
}

func TestOpenAPIServed(t *testing.T) {
	doc := mustOpenAPI(t)
	want, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ base, server string }{{"/", "/"}, {"/kg/", "/kg"}} {
		t.Run("base="+strings.Trim(tc.base, "/"), func(t *testing.T) {
			g := newGateway(t, func(_ *sessions.Config, c *Config) { c.BaseURL = tc.base })
			resp, err := http.Get(g.url + tc.base + "api/openapi.json") // no credentials
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
				t.Fatalf("GET %sapi/openapi.json: %d %s %.200s", tc.base, resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			got, err := openapi3.NewLoader().LoadFromData(body)
			if err != nil {
				t.Fatalf("parsing the served document: %v", err)
			}
			if err := got.Validate(context.Background()); err != nil {
				t.Fatalf("the served document is invalid: %v", err)
			}
			if len(got.Servers) != 1 || got.Servers[0].URL != tc.server {
				t.Errorf("servers = %v, want one with url %q", got.Servers, tc.server)
			}
			if !slices.Equal(openAPIOps(got), openAPIOps(doc)) {
				t.Errorf("served operations differ from openapi.yaml's")
			}
			if !bytes.Contains(body, []byte(`"x-kernelgate-scope":"exec"`)) {
				t.Errorf("the served document lost its x-kernelgate-scope extensions")
			}
			if tc.base == "/" && !bytes.Equal(body, want) {
				t.Errorf("served document differs from the embedded one")
			}
		})
	}
}

// validateEvents checks a run's event stream (NDJSON, or SSE) against the
// RunEvent schema and returns the events.
func validateEvents(t *testing.T, doc *openapi3.T, body []byte, sse bool) []map[string]any {
	t.Helper()
	schema := doc.Components.Schemas["RunEvent"].Value
	var lines []string
	if sse {
		for _, block := range strings.Split(strings.TrimSpace(string(body)), "\n\n") {
			id, data, ok := strings.Cut(block, "\n")
			if !ok || !strings.HasPrefix(id, "id: ") || !strings.HasPrefix(data, "data: ") {
				t.Fatalf("SSE block %q: want id: and data: lines", block)
			}
			data = strings.TrimPrefix(data, "data: ")
			var head struct{ Seq int }
			json.Unmarshal([]byte(data), &head)
			if strings.TrimPrefix(id, "id: ") != strconv.Itoa(head.Seq) {
				t.Errorf("SSE %q: id is not the event's seq", block)
			}
			lines = append(lines, data)
		}
	} else {
		lines = strings.Split(strings.TrimSpace(string(body)), "\n")
	}
	return validateEventLines(t, schema, lines)
}

func validateEventLines(t *testing.T, schema *openapi3.Schema, lines []string) []map[string]any {
	t.Helper()
	var events []map[string]any
	for _, line := range lines {
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("event %q: %v", line, err)
		}
		if err := schema.VisitJSON(v, openapi3.VisitAsResponse()); err != nil {
			t.Errorf("event %s does not match RunEvent: %v", line, err)
		}
		events = append(events, v)
	}
	return events
}

// openAPIFixtures creates what the path parameters of the examples need.
type openAPIFixtures struct {
	t       *testing.T
	g       *testGateway
	doc     *openapi3.T
	kernel  string
	context string
	inputSc *bufio.Scanner // the stream of a run waiting for input
}

func (f *openAPIFixtures) kernelID() string {
	if f.kernel == "" {
		f.kernel = f.g.startKernel("python3").ID
	}
	return f.kernel
}

func (f *openAPIFixtures) contextID() string {
	if f.context == "" {
		status, body := f.g.do("POST", "/api/contexts", map[string]any{"id": "fixture"})
		if status != http.StatusCreated {
			f.t.Fatalf("POST /api/contexts: %d %s", status, body)
		}
		f.context = "fixture"
	}
	return f.context
}

func (f *openAPIFixtures) sessionID() string {
	status, body := f.g.do("POST", "/api/sessions", map[string]any{"path": "fixture.ipynb", "type": "notebook",
		"kernel": map[string]any{"id": f.kernelID()}})
	if status != http.StatusCreated {
		f.t.Fatalf("POST /api/sessions: %d %s", status, body)
	}
	return decode[sessions.SessionModel](f.t, body).ID
}

// awaitingInput starts a streamed run that asks for input and returns its
// id once the input_request event has arrived.
func (f *openAPIFixtures) awaitingInput() string {
	js, _ := json.Marshal(map[string]any{"code": "print('got', input('value? '))", "context": f.contextID(), "stdin": true})
	req, _ := http.NewRequest("POST", f.g.url+"/api/execute", bytes.NewReader(js))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/x-ndjson")
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		f.t.Fatalf("streamed execute: %d %s", resp.StatusCode, b)
	}
	f.inputSc = bufio.NewScanner(resp.Body)
	f.inputSc.Buffer(nil, 1<<20)
	schema := f.doc.Components.Schemas["RunEvent"].Value
	for f.inputSc.Scan() {
		ev := validateEventLines(f.t, schema, []string{f.inputSc.Text()})[0]
		if ev["type"] == "input_request" {
			return resp.Header.Get("X-Run-Id")
		}
		if ev["type"] == "end" {
			break
		}
	}
	f.t.Fatal("the run ended without an input_request event")
	return ""
}

// inputAnswered reads the rest of the input run's stream and checks the
// answer reached the code.
func (f *openAPIFixtures) inputAnswered(value string) {
	schema := f.doc.Components.Schemas["RunEvent"].Value
	var stdout string
	for f.inputSc.Scan() {
		ev := validateEventLines(f.t, schema, []string{f.inputSc.Text()})[0]
		if ev["type"] == "stdout" {
			stdout += ev["text"].(string)
		}
		if ev["type"] == "end" {
			if !strings.Contains(stdout, "got "+value) {
				f.t.Errorf("stdout %q, want the answer %q", stdout, value)
			}
			return
		}
	}
	f.t.Errorf("the input run's stream ended without an end event")
}

// exampleValues lists the request-body examples of an operation.
func exampleValues(op *openapi3.Operation) []any {
	if op.RequestBody == nil {
		return nil
	}
	mt := op.RequestBody.Value.Content.Get("application/json")
	if mt == nil {
		return nil
	}
	var out []any
	if mt.Example != nil {
		out = append(out, mt.Example)
	}
	names := make([]string, 0, len(mt.Examples))
	for name := range mt.Examples {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		out = append(out, mt.Examples[name].Value.Value)
	}
	return out
}

// expand substitutes path parameters.
func expand(path string, params map[string]string) string {
	for k, v := range params {
		path = strings.ReplaceAll(path, "{"+k+"}", url.PathEscape(v))
	}
	return path
}

func TestOpenAPIExamples(t *testing.T) {
	doc := mustOpenAPI(t)
	g := newGateway(t)
	f := &openAPIFixtures{t: t, g: g, doc: doc}
	ctx := context.Background()
	n := 0
	for _, key := range openAPIOps(doc) {
		method, path, _ := strings.Cut(key, " ")
		op := doc.Paths.Value(path).GetOperation(method)
		if op.RequestBody == nil {
			continue
		}
		examples := exampleValues(op)
		if len(examples) == 0 {
			t.Errorf("%s: the request body has no example", key)
			continue
		}
		for i, example := range examples {
			n++
			t.Run(fmt.Sprintf("%s/%d", op.OperationID, i), func(t *testing.T) {
				f.t = t
				params := map[string]string{}
				switch path {
				case "/api/kernels", "/api/sessions", "/api/contexts", "/api/execute":
				case "/api/sessions/{id}":
					params["id"] = f.sessionID()
				case "/api/contexts/{id}/tokens", "/api/contexts/{id}/commands":
					params["id"] = f.contextID()
				case "/api/contexts/{id}/files/{file}":
					params["id"], params["file"] = f.contextID(), "sales.csv"
				case "/api/runs/{id}/input":
					params["id"] = f.awaitingInput()
				default:
					t.Fatalf("no fixture for the path parameters of %s: add one", key)
				}
				js, err := json.Marshal(example)
				if err != nil {
					t.Fatal(err)
				}
				newReq := func() *http.Request {
					req, err := http.NewRequest(method, g.url+expand(path, params), bytes.NewReader(js))
					if err != nil {
						t.Fatal(err)
					}
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Authorization", "Bearer "+testToken)
					return req
				}
				in := &openapi3filter.RequestValidationInput{
					Request: newReq(), PathParams: params, Route: openAPIRoute(t, doc, method, path),
					Options: &openapi3filter.Options{AuthenticationFunc: openAPIAuth, SkipSettingDefaults: true},
				}
				if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
					t.Fatalf("the example %s does not validate: %v", js, err)
				}
				resp, err := http.DefaultClient.Do(newReq())
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if want := successStatus(t, op); resp.StatusCode != want {
					t.Fatalf("%s %s: %d %s, want %d", key, js, resp.StatusCode, body, want)
				}
				out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode,
					Header: resp.Header, Options: &openapi3filter.Options{IncludeResponseStatus: true}}
				if err := openapi3filter.ValidateResponse(ctx, out.SetBodyBytes(body)); err != nil {
					t.Errorf("the response %s does not match the document: %v", body, err)
				}
				if path == "/api/runs/{id}/input" {
					f.inputAnswered(example.(map[string]any)["value"].(string))
				}
			})
		}
	}
	if n == 0 {
		t.Fatal("no request-body examples in openapi.yaml")
	}
}

// opCall is one call of TestOpenAPIOperations.
type opCall struct {
	name   string // subtest
	method string
	path   string // as documented
	params map[string]string
	query  string
	header map[string]string
	anon   bool // without credentials
	want   int
	sse    bool
	events []string // event types the stream must have
}

func TestOpenAPIOperations(t *testing.T) {
	doc := mustOpenAPI(t)
	g := newGateway(t)
	ctx := context.Background()

	// Fixtures: a kernel with a session, a context with a finished run.
	kernel := g.startKernel("python3").ID
	status, body := g.do("POST", "/api/sessions", map[string]any{"path": "ops.ipynb", "type": "notebook", "kernel": map[string]any{"id": kernel}})
	if status != http.StatusCreated {
		t.Fatalf("POST /api/sessions: %d %s", status, body)
	}
	session := decode[sessions.SessionModel](t, body).ID
	status, body = g.do("POST", "/api/contexts", map[string]any{"id": "ops"})
	if status != http.StatusCreated {
		t.Fatalf("POST /api/contexts: %d %s", status, body)
	}
	// A run whose stream has an event of most types.
	code := "from IPython.display import clear_output\nimport sys\nclear_output(wait=True)\nprint('hi')\nprint('warn', file=sys.stderr)\n" +
		"h = display('x', display_id=True)\nh.update('y')\n1/0"
	status, body = g.do("POST", "/api/execute", map[string]any{"code": code, "context": "ops"})
	if status != http.StatusOK {
		t.Fatalf("POST /api/execute: %d %s", status, body)
	}
	run := decode[runs.Execution](t, body).ID

	k, s, c, r := map[string]string{"id": kernel}, map[string]string{"id": session}, map[string]string{"id": "ops"}, map[string]string{"id": run}
	cf := map[string]string{"id": "ops", "file": "hello.txt"}
	if status, body := g.put("ops", "hello.txt", strings.NewReader("hello"), nil); status != http.StatusCreated {
		t.Fatalf("PUT hello.txt: %d %s", status, body)
	}
	calls := []opCall{
		{name: "healthz", method: "GET", path: "/healthz", anon: true, want: 200},
		{name: "readyz", method: "GET", path: "/readyz", anon: true, want: 200},
		{name: "metrics", method: "GET", path: "/metrics", want: 200},
		{name: "metrics-unauthorized", method: "GET", path: "/metrics", anon: true, want: 401},
		{name: "openapi", method: "GET", path: "/api/openapi.json", anon: true, want: 200},
		{name: "api", method: "GET", path: "/api", anon: true, want: 200},
		{name: "status", method: "GET", path: "/api/status", want: 200},
		{name: "kernelspecs", method: "GET", path: "/api/kernelspecs", want: 200},
		{name: "kernelspec", method: "GET", path: "/api/kernelspecs/{name}", params: map[string]string{"name": "python3"}, want: 200},
		{name: "kernelspec-missing", method: "GET", path: "/api/kernelspecs/{name}", params: map[string]string{"name": "nope"}, want: 404},
		{name: "kernelspec-file", method: "GET", path: "/kernelspecs/{name}/{file}", params: map[string]string{"name": "python3", "file": "logo-64x64.png"},
			query: "token=" + testToken, anon: true, want: 200},
		{name: "kernelspec-file-head", method: "HEAD", path: "/kernelspecs/{name}/{file}", params: map[string]string{"name": "python3", "file": "logo-64x64.png"}, want: 200},
		{name: "kernels", method: "GET", path: "/api/kernels", want: 200},
		{name: "kernel", method: "GET", path: "/api/kernels/{id}", params: k, want: 200},
		{name: "kernel-missing", method: "GET", path: "/api/kernels/{id}", params: map[string]string{"id": "00000000-0000-4000-8000-000000000000"}, want: 404},
		{name: "kernel-interrupt", method: "POST", path: "/api/kernels/{id}/interrupt", params: k, want: 204},
		{name: "kernel-restart", method: "POST", path: "/api/kernels/{id}/restart", params: k, want: 200},
		{name: "channels-no-upgrade", method: "GET", path: "/api/kernels/{id}/channels", params: k, want: 400},
		{name: "sessions", method: "GET", path: "/api/sessions", want: 200},
		{name: "session", method: "GET", path: "/api/sessions/{id}", params: s, want: 200},
		{name: "contexts", method: "GET", path: "/api/contexts", want: 200},
		{name: "contexts-unauthorized", method: "GET", path: "/api/contexts", anon: true, want: 401},
		{name: "context", method: "GET", path: "/api/contexts/{id}", params: c, want: 200},
		{name: "context-missing", method: "GET", path: "/api/contexts/{id}", params: map[string]string{"id": "nope"}, want: 404},
		{name: "context-interrupt", method: "POST", path: "/api/contexts/{id}/interrupt", params: c, want: 204},
		{name: "context-restart", method: "POST", path: "/api/contexts/{id}/restart", params: c, want: 200},
		{name: "run", method: "GET", path: "/api/runs/{id}", params: r, want: 200},
		{name: "run-missing", method: "GET", path: "/api/runs/{id}", params: map[string]string{"id": "nope"}, want: 404},
		{name: "run-events", method: "GET", path: "/api/runs/{id}/events", params: r, header: map[string]string{"Accept": "application/x-ndjson"}, want: 200,
			events: []string{"start", "clear_output", "stdout", "stderr", "result", "display_update", "error", "end"}},
		{name: "run-events-sse", method: "GET", path: "/api/runs/{id}/events", params: r, query: "after=1", header: map[string]string{"Accept": "text/event-stream"}, want: 200, sse: true},
		{name: "run-interrupt", method: "POST", path: "/api/runs/{id}/interrupt", params: r, want: 204},
		{name: "context-tokens-revoke", method: "DELETE", path: "/api/contexts/{id}/tokens", params: c, want: 204},
		{name: "context-tokens-revoke-missing", method: "DELETE", path: "/api/contexts/{id}/tokens", params: map[string]string{"id": "nope"}, want: 404},
		{name: "context-tokens-revoke-all", method: "DELETE", path: "/api/context-tokens", want: 204},
		{name: "run-kill", method: "POST", path: "/api/runs/{id}/kill", params: r, want: 204},
		{name: "languages", method: "GET", path: "/api/languages", want: 200},
		{name: "files", method: "GET", path: "/api/contexts/{id}/files", params: c, query: "recursive=true", want: 200},
		{name: "file", method: "GET", path: "/api/contexts/{id}/files/{file}", params: cf, want: 200},
		{name: "file-range", method: "GET", path: "/api/contexts/{id}/files/{file}", params: cf, header: map[string]string{"Range": "bytes=0-1"}, want: 206},
		{name: "file-head", method: "HEAD", path: "/api/contexts/{id}/files/{file}", params: cf, want: 200},
		{name: "file-missing", method: "GET", path: "/api/contexts/{id}/files/{file}", params: map[string]string{"id": "ops", "file": "nope.txt"}, want: 404},
		{name: "file-escape", method: "GET", path: "/api/contexts/{id}/files/{file}", params: map[string]string{"id": "ops", "file": "../x"}, want: 400},
		{name: "file-delete", method: "DELETE", path: "/api/contexts/{id}/files/{file}", params: cf, want: 204},
		{name: "delete-session", method: "DELETE", path: "/api/sessions/{id}", params: s, want: 204},
		{name: "delete-context", method: "DELETE", path: "/api/contexts/{id}", params: c, want: 204},
	}
	// The context's kernel is deleted through the Jupyter surface before
	// the context goes (the session took the other kernel with it).
	deleteKernel := opCall{name: "delete-kernel", method: "DELETE", path: "/api/kernels/{id}", want: 204}

	// Every operation without a request body is called here; those with
	// one are TestOpenAPIExamples'.
	called := map[string]bool{"GET /api/kernels/{id}/channels": true, "DELETE /api/kernels/{id}": true}
	for _, call := range calls {
		called[call.method+" "+call.path] = true
	}
	for _, key := range openAPIOps(doc) {
		method, path, _ := strings.Cut(key, " ")
		if doc.Paths.Value(path).GetOperation(method).RequestBody == nil && !called[key] {
			t.Errorf("%s is not called: add it to the calls", key)
		}
	}

	for _, call := range calls {
		if call.name == "delete-context" {
			status, body := g.do("GET", "/api/contexts/ops", nil)
			if status != http.StatusOK {
				t.Fatalf("GET /api/contexts/ops: %d %s", status, body)
			}
			cm := decode[sessions.ContextModel](t, body)
			if cm.KernelID == nil {
				t.Fatalf("context ops has no kernel: %s", body)
			}
			deleteKernel.params = map[string]string{"id": *cm.KernelID}
			callOperation(t, ctx, g, doc, deleteKernel)
		}
		callOperation(t, ctx, g, doc, call)
	}

	t.Run("channels", func(t *testing.T) {
		route := openAPIRoute(t, doc, "GET", "/api/kernels/{id}/channels")
		want := successStatus(t, route.Operation)
		ws, resp, err := g.dial(g.startKernel("python3").ID, "openapi", true, nil)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer ws.conn.Close()
		if resp.StatusCode != want || resp.Header.Get("Sec-WebSocket-Protocol") != v1Protocol {
			t.Errorf("upgrade: %d, subprotocol %q; want %d and %s", resp.StatusCode, resp.Header.Get("Sec-WebSocket-Protocol"), want, v1Protocol)
		}
	})
}

// callOperation makes one call and checks its status and its response
// against the document.
func callOperation(t *testing.T, ctx context.Context, g *testGateway, doc *openapi3.T, call opCall) {
	t.Run(call.name, func(t *testing.T) {
		route := openAPIRoute(t, doc, call.method, call.path)
		u := g.url + expand(call.path, call.params)
		if call.query != "" {
			u += "?" + call.query
		}
		newReq := func() *http.Request {
			req, err := http.NewRequest(call.method, u, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !call.anon {
				req.Header.Set("Authorization", "Bearer "+testToken)
			}
			for k, v := range call.header {
				req.Header.Set(k, v)
			}
			return req
		}
		in := &openapi3filter.RequestValidationInput{Request: newReq(), PathParams: call.params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openAPIAuth, SkipSettingDefaults: true}}
		if call.want < 400 {
			if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
				t.Fatalf("the request does not validate: %v", err)
			}
		}
		resp, err := http.DefaultClient.Do(newReq())
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != call.want {
			t.Fatalf("%s %s: %d %.300s, want %d", call.method, u, resp.StatusCode, body, call.want)
		}
		if _, ok := route.Operation.Responses.Map()[strconv.Itoa(resp.StatusCode)]; !ok {
			t.Errorf("status %d is not documented", resp.StatusCode)
		}
		opts := &openapi3filter.Options{IncludeResponseStatus: true}
		switch ct, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";"); {
		case ct == "application/x-ndjson" || ct == "text/event-stream":
			opts.ExcludeResponseBody = true
			events := validateEvents(t, doc, body, call.sse)
			if len(events) == 0 || events[len(events)-1]["type"] != "end" {
				t.Errorf("the stream does not end with an end event: %s", body)
			}
			for _, typ := range call.events {
				if !slices.ContainsFunc(events, func(e map[string]any) bool { return e["type"] == typ }) {
					t.Errorf("the stream has no %s event: %s", typ, body)
				}
			}
		case call.path == "/kernelspecs/{name}/{file}", call.path == "/api/contexts/{id}/files/{file}":
			opts.ExcludeResponseBody = true // the file itself
		}
		out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header, Options: opts}
		if err := openapi3filter.ValidateResponse(ctx, out.SetBodyBytes(body)); err != nil {
			t.Errorf("the response %.300s does not match the document: %v", body, err)
		}
	})
}

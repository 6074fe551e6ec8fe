package gateway

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"kernelgate/internal/timefmt"
)

// TestClientDurationsBounded sends every duration a client can give (run
// timeouts on REST and MCP, context-token TTLs, E2B sandbox timeouts on
// create, timeout, connect and refresh) out of range, and at the edges of
// its range: out of range is refused with 400 and changes nothing; the
// largest accepted value gives an end that far in the future, never one
// wrapped into the past.
func TestClientDurationsBounded(t *testing.T) {
	g := newGateway(t)
	if status, body := g.do("POST", "/api/contexts", map[string]any{"id": "dur"}); status != http.StatusCreated {
		t.Fatalf("context: %d %s", status, body)
	}
	e2bKey := map[string]string{"X-API-KEY": g.token}
	sbID, _ := e2bSandbox(t, g, `{"timeout": 600}`)
	endOf := func(t *testing.T) time.Time {
		t.Helper()
		status, body := g.doWith("GET", "/e2b/v2/sandboxes/"+sbID, nil, e2bKey)
		if status != http.StatusOK {
			t.Fatalf("sandbox %s gone: %d %s", sbID, status, body)
		}
		end, err := timefmt.Parse(decode[map[string]any](t, body)["endAt"].(string))
		if err != nil {
			t.Fatal(err)
		}
		return end
	}
	cs, err := mcpClient(t, g, "Bearer "+g.token)
	if err != nil {
		t.Fatal(err)
	}
	mcpRun := func(timeout float64) (int, []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "run_code", Arguments: map[string]any{"code": "1", "context": "dur", "timeout": timeout}})
		if err != nil {
			return http.StatusBadRequest, []byte(err.Error())
		}
		if res.IsError {
			return http.StatusBadRequest, []byte(texts(res))
		}
		return http.StatusOK, []byte(texts(res))
	}

	type send func(v float64) (int, []byte)
	rest := func(method, path, field string, extra map[string]any, hdr map[string]string) send {
		return func(v float64) (int, []byte) {
			body := map[string]any{field: v}
			for k, x := range extra {
				body[k] = x
			}
			return g.doWith(method, path, body, hdr)
		}
	}
	sandbox := "/e2b/v2/sandboxes/" + sbID
	day, year := 86400.0, 365*86400.0
	for _, c := range []struct {
		name    string
		send    send
		max     float64
		okCode  int
		accepts []float64 // besides max
	}{
		{"execute timeout", rest("POST", "/api/execute", "timeout", map[string]any{"code": "1", "context": "dur"}, g.auth()), year, 200, []float64{0, 30}},
		{"isolated execute timeout", rest("POST", "/api/execute", "timeout", map[string]any{"code": "1", "isolated": true}, g.auth()), year, 200, nil},
		{"MCP run_code timeout", mcpRun, year, 200, []float64{0}},
		{"context token ttl", rest("POST", "/api/contexts/dur/tokens", "ttl", nil, g.auth()), day, 201, []float64{1}},
		{"E2B create timeout", rest("POST", "/e2b/v2/sandboxes", "timeout", nil, e2bKey), day, 201, nil},
		{"E2B set timeout", rest("POST", sandbox+"/timeout", "timeout", nil, e2bKey), day, 204, []float64{600}},
		{"E2B connect timeout", rest("POST", sandbox+"/connect", "timeout", nil, e2bKey), day, 200, []float64{60}},
		{"E2B refresh duration", rest("POST", sandbox+"/refreshes", "duration", nil, e2bKey), 3600, 204, []float64{0}},
	} {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			before := endOf(t)
			// 9.3e9 and 1e10 seconds overflow a time.Duration (ns in an
			// int64): unchecked, they wrapped to an end in 1734.
			for _, v := range []float64{-1, c.max + 1, 9.3e9, 1e10, 1e300} {
				status, body := c.send(v)
				if status != http.StatusBadRequest {
					t.Errorf("%s %v: %d %s, want 400", c.name, v, status, body)
				} else if !strings.Contains(strings.ToLower(string(body)), "second") && !strings.Contains(string(body), "greater than") {
					t.Errorf("%s %v: the message says nothing of the range: %s", c.name, v, body)
				}
			}
			if after := endOf(t); !after.Equal(before) {
				t.Errorf("%s: refused values moved the sandbox's end from %v to %v", c.name, before, after)
			}
			for _, v := range append(c.accepts, c.max) {
				sent := time.Now()
				status, body := c.send(v)
				if status != c.okCode {
					t.Fatalf("%s %v: %d %s, want %d", c.name, v, status, body, c.okCode)
				}
				var end time.Time
				switch c.name {
				case "context token ttl":
					tok := decode[map[string]string](t, body)
					end, _ = timefmt.Parse(tok["expiresAt"])
					as := map[string]string{"Authorization": "Bearer " + tok["token"]}
					if status, body := g.doWith("GET", "/api/contexts/dur", nil, as); status != http.StatusOK {
						t.Errorf("a token of ttl %v does not open its context: %d %s", v, status, body)
					}
				case "E2B create timeout":
					sb := decode[map[string]any](t, body)
					end, _ = timefmt.Parse(sb["endAt"].(string))
					g.doWith("DELETE", "/e2b/v2/sandboxes/"+sb["sandboxID"].(string), nil, e2bKey)
				case "E2B set timeout", "E2B connect timeout":
					end = endOf(t)
				default:
					continue
				}
				if want := sent.Add(time.Duration(v) * time.Second); end.Before(want.Add(-time.Second)) {
					t.Errorf("%s %v: ends at %v, want about %v", c.name, v, end, want)
				}
			}
		})
	}
	// The sandbox lived through all of it.
	if end := endOf(t); end.Before(time.Now()) {
		t.Errorf("sandbox end %v is past", end)
	}
}

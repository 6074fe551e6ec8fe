package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// bigText is n bytes of CSV-like text.
func bigText(n int) []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%08d,%s\n", i, strings.Repeat("abcdefgh", 8))
	}
	return b.Bytes()[:n]
}

// tailWriter counts what passes through it and keeps its last bytes.
type tailWriter struct {
	n    int64
	tail []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	w.tail = append(w.tail, p...)
	if len(w.tail) > 512 {
		w.tail = append(w.tail[:0], w.tail[len(w.tail)-512:]...)
	}
	return len(p), nil
}

// mcpReadRaw calls read_file over plain HTTP and streams the answer away,
// keeping its size and its end: the client holds no copy of the file, so
// the memory of this process is the gateway's.
func mcpReadRaw(g *testGateway, id int, context, path string) (int64, string, error) {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call",
		"params": map[string]any{"name": "read_file", "arguments": map[string]any{"context": context, "path": path}}})
	req, err := http.NewRequest("POST", g.url+"/mcp", bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+g.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var w tailWriter
	if _, err := io.Copy(&w, resp.Body); err != nil {
		return 0, "", err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, "", fmt.Errorf("POST /mcp: %d %s", resp.StatusCode, w.tail)
	}
	return w.n, string(w.tail), nil
}

// controlText is n bytes of valid UTF-8 made of control characters, most
// of them six bytes as a JSON string.
func controlText(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(1 + i%31)
	}
	return b
}

// Many parallel read_file calls of files at the size limit are all
// answered, and the gateway's memory stays within what its budget of reads
// in flight costs instead of growing with each call: CSV text, and text
// that JSON makes five times larger.
func TestMCPParallelReadsBoundMemory(t *testing.T) {
	const size = 8 << 20    // read_file's default limit
	const budget = 3 * size // the default of what the answers of read_file calls in flight hold
	const parallel = 16
	g := newGateway(t)
	if status, out := g.do("POST", "/api/contexts", map[string]any{"id": "reads"}); status != http.StatusCreated {
		t.Fatalf("create context: %d %s", status, out)
	}
	cs, err := mcpClient(t, g, "Bearer "+g.token)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, file string
		data       func(int) []byte
	}{
		{"csv", "big.csv", bigText},
		{"control characters", "control.txt", controlText},
	} {
		t.Run(c.name, func(t *testing.T) {
			data := c.data(size)
			if status, out := g.do("PUT", "/api/contexts/reads/files/"+c.file, data); status != http.StatusCreated {
				t.Fatalf("upload: %d %s", status, out)
			}
			// One read through the official client: the file comes back whole.
			res := call(t, cs, "read_file", map[string]any{"context": "reads", "path": c.file})
			got := []byte(strings.TrimSuffix(texts(res), "\n"))
			if meta := structured[map[string]any](t, res); res.IsError || meta["encoding"] != "utf-8" || !bytes.Equal(got, data) {
				t.Fatalf("read_file: isError %v, %v, %d bytes back; want the file's %d as text", res.IsError, meta, len(got), size)
			}
			js, _ := json.Marshal(res.Content[0])
			answer := int64(len(js)) // what one answer's content takes in JSON
			res, data, got, js = nil, nil, nil, nil

			runtime.GC()
			before := rssBytes(t)
			resetPeakRSS(t)
			var wg sync.WaitGroup
			errs := make([]error, parallel)
			for i := range parallel {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n, tail, err := mcpReadRaw(g, i+1, "reads", c.file)
					switch {
					case err != nil:
						errs[i] = err
					case n < size || strings.Contains(tail, `"isError":true`) || !strings.Contains(tail, fmt.Sprintf(`"size":%d`, size)):
						errs[i] = fmt.Errorf("answer of %d bytes ending %q", n, tail)
					}
				}()
			}
			wg.Wait()
			peak := peakRSS(t) - before
			for i, err := range errs {
				if err != nil {
					t.Errorf("read %d: %v", i, err)
				}
			}
			// The calls in flight hold at most the budget, or one
			// answer larger than it; each byte of it costs a few copies
			// (the text, the tool result's JSON, the JSON-RPC message,
			// the garbage of their making): allow eight, and 64 MiB for
			// the rest of the process.
			limit := 8*max(budget, answer) + 64<<20
			t.Logf("gateway peak RSS growth over %d parallel reads of %d MiB (answers of %d MiB): %d MiB", parallel, size>>20, answer>>20, peak>>20)
			if peak > limit {
				t.Errorf("gateway RSS grew by %d MiB at its peak over %d parallel read_file calls of %d MiB, want under %d MiB",
					peak>>20, parallel, size>>20, limit>>20)
			}
		})
	}
}

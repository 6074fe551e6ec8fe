package gateway

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"kernelgate/internal/needs"
	"kernelgate/sessions"
)

// procCounts is this process's threads and open descriptors (the gateway
// under test runs in it).
func procCounts(t *testing.T) (threads, fds int) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		needs.Skip(t, "no /proc: %v", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			threads, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	des, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		needs.Skip(t, "no /proc/self/fd: %v", err)
	}
	return threads, len(des)
}

// releaseFIFOsAtEnd opens every FIFO named when the test ends, which lets
// opens waiting for a writer go on (without it, a gateway that waits on a
// FIFO would hold the test's shutdown).
func releaseFIFOsAtEnd(t *testing.T, paths ...string) {
	t.Cleanup(func() {
		for _, p := range paths {
			if f, err := os.OpenFile(p, os.O_RDWR|syscall.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
		}
	})
}

// healthWatch asks /healthz every 100 ms until stopped and counts the
// answers that were not 200 within 5 s.
type healthWatch struct {
	asked, failed atomic.Int64
	last          atomic.Value
	stop          chan struct{}
	done          chan struct{}
}

func watchHealth(g *testGateway) *healthWatch {
	h := &healthWatch{stop: make(chan struct{}), done: make(chan struct{})}
	client := &http.Client{Timeout: 5 * time.Second}
	go func() {
		defer close(h.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			resp, err := client.Get(g.url + "/healthz")
			h.asked.Add(1)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			if err != nil {
				h.failed.Add(1)
				h.last.Store(err.Error())
			}
			select {
			case <-h.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return h
}

func (h *healthWatch) end() {
	close(h.stop)
	<-h.done
}

// flood sends n requests through do from workers goroutines; each must
// answer within the client's timeout with what ok accepts. The first
// failure stops the flood and is returned.
func flood(n, workers int, do func(i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var stopped atomic.Bool
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for !stopped.Load() {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := do(i); err != nil {
					once.Do(func() { first = err; stopped.Store(true) })
				}
			}
		})
	}
	wg.Wait()
	return first
}

// TestFilesFIFOFloodAnswers: a kernel makes named pipes in its workspace,
// and a read key floods the gateway with requests for them, by REST GET
// and HEAD, MCP read_file and the E2B GET /files. Every one is refused at
// once (400), the gateway's threads and descriptors come back to what
// they were, /healthz answers all along, and a kernel swapping a file and
// a FIFO while they are read never makes a request wait.
func TestFilesFIFOFloodAnswers(t *testing.T) {
	const readKey = "fifo-read-key-0123456789"
	g := newGateway(t, func(_ *sessions.Config, c *Config) {
		c.APIKeys = []APIKey{mustKey(t, "reader read "+readKey)}
	})
	b4Context(t, g, map[string]any{"id": "fifo"})
	mustRun(t, g, map[string]any{"context": "fifo", "code": "import os; os.mkfifo('pipe'); open('fine.txt', 'w').write('fine')"})
	c, err := g.mgr.Context("fifo")
	if err != nil {
		t.Fatal(err)
	}
	dir := c.Workspace().Dir()
	releaseFIFOsAtEnd(t, filepath.Join(dir, "pipe"))

	sandbox, token := e2bSandbox(t, g, `{}`)
	sbx := map[string]string{"E2b-Sandbox-Id": sandbox, "X-Access-Token": token}
	if status, out := g.doWith("POST", "/e2b/execute", `{"code":"import os; os.mkfifo('pipe')"}`, sbx); status != http.StatusOK || strings.Contains(string(out), `"error"`) {
		t.Fatalf("mkfifo in the sandbox: %d %s", status, out)
	}
	sc, err := g.mgr.Context(sandboxContexts(t, g, sandbox)[0])
	if err != nil {
		t.Fatal(err)
	}
	releaseFIFOsAtEnd(t, filepath.Join(sc.Workspace().Dir(), "pipe"))

	cs, err := mcpClient(t, g, "Bearer "+readKey)
	if err != nil {
		t.Fatal(err)
	}

	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer client.CloseIdleConnections()
	send := func(method, path string, headers map[string]string) (int, string, error) {
		req, err := http.NewRequest(method, g.url+path, nil)
		if err != nil {
			return 0, "", err
		}
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", fmt.Errorf("%s %s: no answer: %w", method, path, err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return resp.StatusCode, b.String(), nil
	}
	reader := map[string]string{"Authorization": "Bearer " + readKey}
	refused := func(method, path string, headers map[string]string, code string) func(int) error {
		return func(int) error {
			status, body, err := send(method, path, headers)
			if err != nil {
				return err
			}
			if status != http.StatusBadRequest || !strings.Contains(body, code) {
				return fmt.Errorf("%s %s: %d %s, want 400 %s", method, path, status, body, code)
			}
			return nil
		}
	}

	// A first round opens the connections the flood reuses.
	if err := flood(16, 16, func(int) error {
		if status, body, err := send("GET", "/api/contexts/fifo/files/fine.txt", reader); err != nil || status != 200 || body != "fine" {
			return fmt.Errorf("a file: %d %q %v", status, body, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	client.CloseIdleConnections()
	runtime.GC()
	threads0, fds0 := procCounts(t)
	goroutines0 := runtime.NumGoroutine()

	health := watchHealth(g)
	surfaces := []struct {
		name string
		n    int
		do   func(int) error
	}{
		{"REST GET", 400, refused("GET", "/api/contexts/fifo/files/pipe", reader, "not a regular file")},
		{"REST HEAD", 400, refused("HEAD", "/api/contexts/fifo/files/pipe", reader, "")},
		{"E2B GET /files", 400, refused("GET", "/e2b/files?path=pipe", sbx, "not a regular file")},
		{"MCP read_file", 100, func(int) error {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "read_file", Arguments: map[string]any{"context": "fifo", "path": "pipe"}})
			if err != nil {
				return fmt.Errorf("read_file: no answer: %w", err)
			}
			if !res.IsError || !strings.Contains(texts(res), "not a regular file") {
				return fmt.Errorf("read_file of a FIFO: %v %q", res.IsError, texts(res))
			}
			return nil
		}},
	}
	for _, s := range surfaces {
		if err := flood(s.n, 32, s.do); err != nil {
			t.Errorf("%s: %v", s.name, err)
		}
	}
	if t.Failed() {
		health.end()
		t.FailNow()
	}
	threadsPeak, _ := procCounts(t)

	// A kernel swaps a file and a FIFO as fast as it can while the file
	// is downloaded: every request answers, the file or a refusal.
	mustRun(t, g, map[string]any{"context": "fifo", "code": `
import ctypes, os, threading
libc = ctypes.CDLL(None, use_errno=True)
open('f', 'w').write('data')
os.mkfifo('g')
def swap():
    while not os.path.exists('stop'):
        if libc.renameat2(-100, b'f', -100, b'g', 2) != 0:
            open('swap-failed', 'w').write(os.strerror(ctypes.get_errno()))
            return
threading.Thread(target=swap, daemon=True).start()
`})
	releaseFIFOsAtEnd(t, filepath.Join(dir, "f"), filepath.Join(dir, "g"))
	var files, fifos atomic.Int64
	err = flood(400, 16, func(int) error {
		status, body, err := send("GET", "/api/contexts/fifo/files/f", reader)
		switch {
		case err != nil:
			return err
		case status == http.StatusOK && body == "data":
			files.Add(1)
		case status == http.StatusBadRequest && strings.Contains(body, "not a regular file"):
			fifos.Add(1)
		default:
			return fmt.Errorf("GET of a file swapped with a FIFO: %d %s", status, body)
		}
		return nil
	})
	os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644)
	health.end()
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "swap-failed")); err == nil {
		needs.Skip(t, "renameat2 in the kernel: %s", b)
	}
	t.Logf("swapped: %d downloads, %d refusals", files.Load(), fifos.Load())

	if n := health.failed.Load(); n != 0 {
		t.Errorf("/healthz failed %d of %d times during the flood (last: %v)", n, health.asked.Load(), health.last.Load())
	}
	// Nothing waits on a pipe: the threads never grew by a thread a
	// request, and descriptors and goroutines come back once the clients
	// have gone.
	if threadsPeak > threads0+16 {
		t.Errorf("threads went from %d to %d over the flood", threads0, threadsPeak)
	}
	client.CloseIdleConnections()
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	var threads, fds, goroutines int
	checkFor(t, 30*time.Second, "descriptors and goroutines back after the flood", func() bool {
		threads, fds = procCounts(t)
		goroutines = runtime.NumGoroutine()
		return fds <= fds0+8 && goroutines <= goroutines0+16
	})
	t.Logf("threads %d → %d (peak %d), descriptors %d → %d, goroutines %d → %d", threads0, threads, threadsPeak, fds0, fds, goroutines0, goroutines)
	if status, body, err := send("GET", "/api/contexts/fifo/files/fine.txt", reader); err != nil || status != 200 || body != "fine" {
		t.Errorf("a file after the flood: %d %q %v", status, body, err)
	}
}

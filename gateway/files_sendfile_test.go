package gateway

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// readFromRecorder is the connection's http.ResponseWriter, noting what
// reaches its ReadFrom (net/http's, which sends a file with sendfile).
type readFromRecorder struct {
	http.ResponseWriter
	mu    sync.Mutex
	files int   // ReadFrom calls with a file
	bytes int64 // bytes they carried
}

func (w *readFromRecorder) ReadFrom(src io.Reader) (int64, error) {
	r := src
	if lr, ok := r.(*io.LimitedReader); ok {
		r = lr.R
	}
	n, err := w.ResponseWriter.(io.ReaderFrom).ReadFrom(src)
	if _, ok := r.(*os.File); ok {
		w.mu.Lock()
		w.files++
		w.bytes += n
		w.mu.Unlock()
	}
	return n, err
}

// A download hands its file to the connection's ReadFrom (sendfile)
// rather than copying it through a buffer of the gateway.
func TestDownloadHandsTheFileToTheConnection(t *testing.T) {
	g := newGateway(t)
	ctx := b4Context(t, g, map[string]any{"id": "sendfile"})
	want := make([]byte, 3<<20)
	rand.Read(want)
	if err := os.WriteFile(filepath.Join(ctx.Cwd, "big.bin"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	rec := &readFromRecorder{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.ResponseWriter = w
		g.srv.ServeHTTP(rec, r)
	}))
	defer hs.Close()
	req, _ := http.NewRequest("GET", hs.URL+"/api/contexts/sendfile/files/big.bin", nil)
	req.Header.Set("Authorization", "token "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(got, want) {
		t.Fatalf("GET: %d, %d bytes, %v", resp.StatusCode, len(got), err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	// net/http writes the first 512 bytes itself, with the headers.
	if rec.files != 1 || rec.bytes < int64(len(want))-512 {
		t.Errorf("the connection's ReadFrom got %d files, %d bytes of %d: the download went through the gateway's buffers, not sendfile", rec.files, rec.bytes, len(want))
	}
}

// Downloads over the gateway's own listener (raw reads and writes, files
// sent with sendfile): whole, by ranges, HEAD, and a file the kernel
// appends to or truncates while it is being sent, which neither hangs
// the client nor hands it bytes the file never held.
func TestDownloadsOverTheGatewaysListener(t *testing.T) {
	g := newGateway(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.srv.Serve(l)
	url := "http://" + l.Addr().String() + "/api/contexts/dl/files/"
	ctx := b4Context(t, g, map[string]any{"id": "dl"})
	want := make([]byte, 64<<20)
	rand.Read(want)
	write := func(name string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(ctx.Cwd, name), want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	client := &http.Client{Timeout: 60 * time.Second}
	get := func(method, name string, headers ...string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, url+name, nil)
		req.Header.Set("Authorization", "token "+testToken)
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	write("big.bin")

	t.Run("whole", func(t *testing.T) {
		resp := get("GET", "big.bin")
		got, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK || resp.ContentLength != int64(len(want)) || !bytes.Equal(got, want) {
			t.Fatalf("GET: %d, length %d, %d bytes, %v", resp.StatusCode, resp.ContentLength, len(got), err)
		}
	})
	t.Run("range", func(t *testing.T) {
		resp := get("GET", "big.bin", "Range", "bytes=1000000-9999999")
		got, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, want[1000000:10000000]) {
			t.Fatalf("GET range: %d, %d bytes, %v", resp.StatusCode, len(got), err)
		}
		if cr := resp.Header.Get("Content-Range"); cr != fmt.Sprintf("bytes 1000000-9999999/%d", len(want)) {
			t.Errorf("Content-Range %q", cr)
		}
	})
	t.Run("ranges", func(t *testing.T) {
		resp := get("GET", "big.bin", "Range", "bytes=0-9,5000000-5999999")
		_, params, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
		if err != nil || resp.StatusCode != http.StatusPartialContent {
			t.Fatalf("GET ranges: %d %q %v", resp.StatusCode, resp.Header.Get("Content-Type"), err)
		}
		mr := multipart.NewReader(resp.Body, params["boundary"])
		for _, r := range [][2]int{{0, 10}, {5000000, 6000000}} {
			p, err := mr.NextPart()
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(p)
			if err != nil || !bytes.Equal(got, want[r[0]:r[1]]) {
				t.Fatalf("part %v: %d bytes, %v", r, len(got), err)
			}
		}
		if _, err := mr.NextPart(); err != io.EOF {
			t.Errorf("after the parts: %v", err)
		}
	})
	t.Run("head", func(t *testing.T) {
		resp := get("HEAD", "big.bin")
		got, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK || len(got) != 0 || resp.Header.Get("Content-Length") != strconv.Itoa(len(want)) {
			t.Fatalf("HEAD: %d, Content-Length %q, %d bytes, %v", resp.StatusCode, resp.Header.Get("Content-Length"), len(got), err)
		}
		// The connection serves the next request.
		resp = get("GET", "big.bin", "Range", "bytes=0-99")
		if got, err := io.ReadAll(resp.Body); err != nil || !bytes.Equal(got, want[:100]) {
			t.Fatalf("GET after HEAD: %d bytes, %v", len(got), err)
		}
	})
	// The client reads the first MiB, the kernel changes the file, the
	// client reads on.
	changed := func(t *testing.T, name, code string) ([]byte, error) {
		t.Helper()
		write(name)
		resp := get("GET", name)
		if resp.StatusCode != http.StatusOK || resp.ContentLength != int64(len(want)) {
			t.Fatalf("GET: %d, length %d", resp.StatusCode, resp.ContentLength)
		}
		first := make([]byte, 1<<20)
		if _, err := io.ReadFull(resp.Body, first); err != nil {
			t.Fatal(err)
		}
		mustRun(t, g, map[string]any{"context": "dl", "code": code})
		rest, err := io.ReadAll(resp.Body)
		return append(first, rest...), err
	}
	t.Run("appended", func(t *testing.T) {
		got, err := changed(t, "grows.bin", "with open('grows.bin', 'ab') as f:\n    f.write(b'x' * (8 << 20))")
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("download of a file appended to: %d bytes of %d, %v", len(got), len(want), err)
		}
	})
	t.Run("truncated", func(t *testing.T) {
		got, err := changed(t, "shrinks.bin", "import os\nos.truncate('shrinks.bin', 2 << 20)")
		if !errors.Is(err, io.ErrUnexpectedEOF) || len(got) >= len(want) {
			t.Fatalf("download of a file truncated: %d bytes of %d, %v; want a short body", len(got), len(want), err)
		}
		if !bytes.Equal(got, want[:len(got)]) {
			t.Fatalf("download of a file truncated: the %d bytes received are not the file's", len(got))
		}
	})
}

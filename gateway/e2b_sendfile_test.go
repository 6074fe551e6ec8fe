package gateway

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// An E2B download (the SDK's files.read) hands its file to the
// connection's ReadFrom (sendfile), as the files API's download does,
// rather than copying it through a buffer of the gateway; the body is the
// file as it was opened, with its length, even when the kernel appends to
// it while it is sent.
func TestE2BDownloadHandsTheFileToTheConnection(t *testing.T) {
	g := newGateway(t)
	sandbox, token := e2bSandbox(t, g, `{}`)
	sbx := map[string]string{"E2b-Sandbox-Id": sandbox, "X-Access-Token": token}
	want := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB
	if status, out := g.doWith("POST", "/e2b/execute", map[string]string{"code": "open('big.bin', 'wb').write(b'0123456789abcdef' * (3 << 16))"}, sbx); status != http.StatusOK || strings.Contains(string(out), `"error"`) {
		t.Fatalf("writing the file: %d %s", status, out)
	}
	rec := &readFromRecorder{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.ResponseWriter = w
		g.srv.ServeHTTP(rec, r)
	}))
	defer hs.Close()
	get := func() *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", hs.URL+"/e2b/files?path=/home/user/big.bin", nil)
		for k, v := range sbx {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != http.StatusOK || resp.ContentLength != int64(len(want)) {
			t.Fatalf("GET: %d, length %d", resp.StatusCode, resp.ContentLength)
		}
		return resp
	}
	got, err := io.ReadAll(get().Body)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("GET: %d bytes, %v", len(got), err)
	}
	rec.mu.Lock()
	files, sent := rec.files, rec.bytes
	rec.mu.Unlock()
	// net/http writes the first 512 bytes itself, with the headers.
	if files != 1 || sent < int64(len(want))-512 {
		t.Errorf("the connection's ReadFrom got %d files, %d bytes of %d: the download went through the gateway's buffers, not sendfile", files, sent, len(want))
	}

	resp := get()
	first := make([]byte, 1<<20)
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatal(err)
	}
	if status, out := g.doWith("POST", "/e2b/execute", map[string]string{"code": "open('big.bin', 'ab').write(b'x' * (8 << 20))"}, sbx); status != http.StatusOK || strings.Contains(string(out), `"error"`) {
		t.Fatalf("appending: %d %s", status, out)
	}
	rest, err := io.ReadAll(resp.Body)
	if got := append(first, rest...); err != nil || !bytes.Equal(got, want) {
		t.Errorf("a download of a file appended to: %d bytes of %d, %v; want the file as it was opened", len(got), len(want), err)
	}
}

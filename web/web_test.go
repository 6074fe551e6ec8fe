package web

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, method, target string, hdr map[string]string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, req)
	return rec.Result()
}

func body(t *testing.T, res *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var assetRef = regexp.MustCompile(`(?:src|href|content)="(static/[^"]+)"`)

func TestIndex(t *testing.T) {
	for _, p := range []string{"/", "/?token=abc", "/index.html"} {
		res := get(t, "GET", p, nil)
		if res.StatusCode != 200 {
			t.Fatalf("GET %s: status %d", p, res.StatusCode)
		}
		if ct := res.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
			t.Errorf("GET %s: Content-Type %q", p, ct)
		}
		if cc := res.Header.Get("Cache-Control"); cc != "no-cache" {
			t.Errorf("GET %s: Cache-Control %q, want no-cache", p, cc)
		}
		if csp := res.Header.Get("Content-Security-Policy"); csp != ContentSecurityPolicy {
			t.Errorf("GET %s: Content-Security-Policy %q", p, csp)
		}
		if got := res.Header.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("GET %s: X-Content-Type-Options %q", p, got)
		}
		b := body(t, res)
		if !strings.Contains(b, `<div id="app"`) {
			t.Errorf("GET %s: body is not the notebook page:\n%s", p, b)
		}
	}
}

// Every file index.html refers to is served, content-hashed and cached for good.
func TestIndexAssets(t *testing.T) {
	page := body(t, get(t, "GET", "/", nil))
	refs := assetRef.FindAllStringSubmatch(page, -1)
	if len(refs) < 4 {
		t.Fatalf("index.html refers to %d static files, want at least 4 (app js, css, frame js, favicon)", len(refs))
	}
	want := map[string]string{".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".txt": "text/plain; charset=utf-8"}
	for _, m := range refs {
		p := "/" + m[1]
		res := get(t, "GET", p, nil)
		if res.StatusCode != 200 {
			t.Errorf("GET %s: status %d", p, res.StatusCode)
			continue
		}
		if cc := res.Header.Get("Cache-Control"); cc != "public, max-age=31536000, immutable" {
			t.Errorf("GET %s: Cache-Control %q, want a long immutable cache", p, cc)
		}
		ext := p[strings.LastIndex(p, "."):]
		if ct := res.Header.Get("Content-Type"); ct != want[ext] {
			t.Errorf("GET %s: Content-Type %q, want %q", p, ct, want[ext])
		}
		if res.Header.Get("Content-Security-Policy") == "" {
			t.Errorf("GET %s: no Content-Security-Policy", p)
		}
		if len(body(t, res)) == 0 {
			t.Errorf("GET %s: empty", p)
		}
	}
}

func TestNotFound(t *testing.T) {
	for _, p := range []string{
		"/nope", "/static", "/static/", "/static/nope.js", "/static/../index.html",
		"/static/%2e%2e/index.html", "/dist/index.html", "/src/main.ts", "/web.go",
		"/index.htm", "/api/kernels", "//static/", "/static//", "/static/x/y.js",
	} {
		res := get(t, "GET", p, nil)
		if res.StatusCode != 404 {
			t.Errorf("GET %s: status %d, want 404", p, res.StatusCode)
		}
		if b := body(t, res); strings.Contains(b, "app-") || strings.Contains(b, "<a href") {
			t.Errorf("GET %s: 404 body lists files: %q", p, b)
		}
		if res.Header.Get("Content-Security-Policy") == "" {
			t.Errorf("GET %s: no Content-Security-Policy on the 404", p)
		}
	}
}

func TestMethods(t *testing.T) {
	res := get(t, "POST", "/", nil)
	if res.StatusCode != 405 || res.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /: status %d, Allow %q", res.StatusCode, res.Header.Get("Allow"))
	}
	res = get(t, "HEAD", "/", nil)
	if res.StatusCode != 200 || body(t, res) != "" {
		t.Errorf("HEAD /: status %d", res.StatusCode)
	}
	if res := get(t, "DELETE", "/nope", nil); res.StatusCode != 404 {
		t.Errorf("DELETE /nope: status %d, want 404", res.StatusCode)
	}
}

func TestRevalidation(t *testing.T) {
	res := get(t, "GET", "/", nil)
	etag := res.Header.Get("ETag")
	if etag == "" {
		t.Fatal("no ETag on index.html")
	}
	res = get(t, "GET", "/", map[string]string{"If-None-Match": etag})
	if res.StatusCode != http.StatusNotModified {
		t.Errorf("GET / with If-None-Match: status %d, want 304", res.StatusCode)
	}
}

func TestGzip(t *testing.T) {
	page := body(t, get(t, "GET", "/", nil))
	var js string
	for _, m := range assetRef.FindAllStringSubmatch(page, -1) {
		if strings.HasPrefix(m[1], "static/app-") && strings.HasSuffix(m[1], ".js") {
			js = "/" + m[1]
		}
	}
	if js == "" {
		t.Fatal("no app-*.js in index.html")
	}
	plain := body(t, get(t, "GET", js, nil))
	res := get(t, "GET", js, map[string]string{"Accept-Encoding": "br, gzip"})
	if res.Header.Get("Content-Encoding") != "gzip" || !strings.Contains(res.Header.Get("Vary"), "Accept-Encoding") {
		t.Fatalf("GET %s accepting gzip: Content-Encoding %q, Vary %q", js, res.Header.Get("Content-Encoding"), res.Header.Get("Vary"))
	}
	zr, err := gzip.NewReader(bytes.NewReader([]byte(body(t, res))))
	if err != nil {
		t.Fatal(err)
	}
	unzipped, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if string(unzipped) != plain {
		t.Error("gzipped body differs from the plain one")
	}
	if res := get(t, "GET", js, map[string]string{"Accept-Encoding": "gzip;q=0"}); res.Header.Get("Content-Encoding") != "" {
		t.Error("gzip sent although refused with q=0")
	}
}

// The policy names no other origin: the page talks to its own gateway only.
func TestPolicyIsSameOrigin(t *testing.T) {
	for _, bad := range []string{"*", "http:", "https:", "ws:", "wss:", "'unsafe-eval'", "allow-same-origin"} {
		if strings.Contains(ContentSecurityPolicy, bad) {
			t.Errorf("Content-Security-Policy contains %q: %s", bad, ContentSecurityPolicy)
		}
	}
	for _, want := range []string{"default-src 'self'", "connect-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "object-src 'none'"} {
		if !strings.Contains(ContentSecurityPolicy, want) {
			t.Errorf("Content-Security-Policy lacks %q", want)
		}
	}
}

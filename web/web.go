// Package web is the embedded browser front-end behind one http.Handler;
// knows nothing of the other packages.
//
// The front-end is a small notebook that talks to the gateway over the
// Jupyter REST API and the kernel websocket, from the page's own origin.
// Its sources are in src/ (TypeScript, CodeMirror 6); build.sh bundles them
// with esbuild into dist/, which is committed and embedded here, so
// `go build` needs no Node.js.
//
// Handler serves exactly two kinds of path:
//
//	/                 index.html, Cache-Control: no-cache (revalidated by ETag)
//	/static/NAME      the bundle's files; content-hashed names are cached for a year
//
// Everything else is 404, and there is no directory listing. Every response
// carries ContentSecurityPolicy. Mount the handler at "/" after the API
// routes (or under a prefix with http.StripPrefix: the page uses relative
// URLs).
package web

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"regexp"
	"strings"
	"sync"
	"time"
)

//go:embed dist
var dist embed.FS

// ContentSecurityPolicy is sent with every response of Handler. The page
// loads only its own scripts and styles and talks only to its own origin
// ('self' covers same-origin ws: and wss: in CSP Level 3 browsers). Kernel
// HTML outputs are rendered in iframes sandboxed with allow-scripts and
// without allow-same-origin (srcdoc, which inherits this policy, so their
// inline scripts do not run and they fetch nothing from other origins);
// images in outputs are data: URLs. style-src allows inline styles because
// output HTML (pandas tables) carries them.
const ContentSecurityPolicy = "default-src 'self'; " +
	"script-src 'self'; " +
	"style-src 'self' 'unsafe-inline'; " +
	"img-src 'self' data: blob:; " +
	"connect-src 'self'; " +
	"frame-src 'self'; " +
	"font-src 'self'; " +
	"object-src 'none'; " +
	"base-uri 'none'; " +
	"form-action 'none'; " +
	"frame-ancestors 'none'"

const (
	cacheImmutable  = "public, max-age=31536000, immutable"
	cacheRevalidate = "no-cache"
)

// hashedName matches the names build.mjs gives bundle files (name-HASH.ext),
// whose content never changes under the same name.
var hashedName = regexp.MustCompile(`^[A-Za-z0-9_.]+-[A-Z0-9]{8}\.[a-z0-9]+$`)

type asset struct {
	data        []byte
	gz          []byte // nil when compression does not pay
	contentType string
	etag        string
	cache       string
}

type site struct {
	index  *asset
	static map[string]*asset // by name under dist/static
}

var loadSite = sync.OnceValue(func() *site {
	s := &site{static: map[string]*asset{}}
	index, err := fs.ReadFile(dist, "dist/index.html")
	if err != nil {
		panic("web: dist/index.html is missing from the embedded bundle; run web/build.sh")
	}
	s.index = newAsset("index.html", index, cacheRevalidate)
	entries, _ := fs.ReadDir(dist, "dist/static")
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		data, err := fs.ReadFile(dist, "dist/static/"+e.Name())
		if err != nil {
			continue
		}
		cache := cacheRevalidate
		if hashedName.MatchString(e.Name()) {
			cache = cacheImmutable
		}
		s.static[e.Name()] = newAsset(e.Name(), data, cache)
	}
	return s
})

var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
	".png":  "image/png",
	".txt":  "text/plain; charset=utf-8",
	".json": "application/json",
}

func newAsset(name string, data []byte, cache string) *asset {
	sum := sha256.Sum256(data)
	a := &asset{
		data:        data,
		contentType: contentTypes[path.Ext(name)],
		etag:        `"` + hex.EncodeToString(sum[:12]) + `"`,
		cache:       cache,
	}
	if a.contentType == "" {
		a.contentType = "application/octet-stream"
	}
	if compressible(a.contentType) && len(data) > 1024 {
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		zw.Write(data)
		zw.Close()
		if buf.Len() < len(data)*9/10 {
			a.gz = buf.Bytes()
		}
	}
	return a
}

func compressible(ct string) bool {
	return strings.HasPrefix(ct, "text/") || strings.HasPrefix(ct, "image/svg") || strings.HasPrefix(ct, "application/json")
}

// Handler serves the embedded front-end (see the package doc).
func Handler() http.Handler {
	s := loadSite()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")

		var a *asset
		switch p := r.URL.Path; {
		case p == "/" || p == "/index.html":
			a = s.index
		case strings.HasPrefix(p, "/static/"):
			name := strings.TrimPrefix(p, "/static/")
			if !strings.Contains(name, "/") {
				a = s.static[name]
			}
		}
		if a == nil {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		serve(w, r, a)
	})
}

func serve(w http.ResponseWriter, r *http.Request, a *asset) {
	h := w.Header()
	h.Set("Content-Type", a.contentType)
	h.Set("Cache-Control", a.cache)
	data, etag := a.data, a.etag
	if a.gz != nil {
		h.Add("Vary", "Accept-Encoding")
		if acceptsGzip(r) {
			data = a.gz
			etag = strings.TrimSuffix(a.etag, `"`) + `-gz"`
			h.Set("Content-Encoding", "gzip")
		}
	}
	h.Set("ETag", etag)
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
}

func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(enc), "gzip") {
			q := strings.ReplaceAll(strings.TrimSpace(params), " ", "")
			return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
		}
	}
	return false
}

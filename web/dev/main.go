// Command dev serves the embedded front-end (web.Handler, with its real
// headers and policy) and proxies the Jupyter API, websockets included, to
// a Jupyter Server or a kernelgate running elsewhere, all on one origin. It
// is for developing and testing the page before or beside the gateway:
//
//	go run ./web/dev -listen 127.0.0.1:18080 -upstream http://127.0.0.1:18888
//
// The bundle is embedded at build time: after web/build.sh, run it again.
package main

import (
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"

	"kernelgate/web"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:18080", "address to serve on")
	upstream := flag.String("upstream", "http://127.0.0.1:18888", "Jupyter Server or gateway to proxy /api/ and /kernelspecs/ to")
	flag.Parse()
	u, err := url.Parse(*upstream)
	if err != nil || u.Host == "" {
		log.Fatalf("dev: bad -upstream %q", *upstream)
	}
	// ReverseProxy passes websocket upgrades through; the Host header stays
	// the page's, so the upstream's Origin check sees one origin.
	proxy := httputil.NewSingleHostReverseProxy(u)
	mux := http.NewServeMux()
	mux.Handle("/api/", proxy)
	mux.Handle("/api", proxy)
	mux.Handle("/kernelspecs/", proxy)
	mux.Handle("/", web.Handler())
	log.Printf("dev: serving http://%s/ (API from %s)", *listen, u)
	log.Fatal(http.ListenAndServe(*listen, mux))
}

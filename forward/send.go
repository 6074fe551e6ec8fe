package forward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// ErrNotSent: the owner could not be reached and the request did not
// leave this replica (the connection was refused or never made): it is
// safe to send again, whatever its method.
var ErrNotSent = errors.New("forward: the request was not sent")

// hopHeaders are dropped from a request sent on (RFC 9110 §7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// Send sends in again to the replica at target with body, on behalf of
// principal, as Forward would (credentials and hop-by-hop headers left
// behind, X-Forwarded-* set, signed), and returns the owner's answer for
// the caller to read: a forward the caller follows and may send again
// (a run that must reach whichever replica owns it). ctx bounds it, the
// answer's body included. An error that wraps ErrUnreachable means no
// answer came; one that also wraps ErrNotSent, that nothing was sent.
func (p *Proxy) Send(ctx context.Context, target *url.URL, in *http.Request, body []byte, principal []byte) (*http.Response, error) {
	u := *in.URL
	u.Scheme, u.Host = target.Scheme, target.Host
	if q := u.Query(); q.Has("token") {
		q.Del("token")
		u.RawQuery = q.Encode()
	}
	out, err := http.NewRequestWithContext(ctx, in.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out.Header = in.Header.Clone()
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	out.Header.Del("Authorization")
	out.Header.Del("Cookie")
	out.Header.Del(Header)
	out.Header.Del("Accept-Encoding")
	out.Host = in.Host
	out.ContentLength = int64(len(body))
	out.Header.Set("Content-Length", strconv.Itoa(len(body)))
	if ip, _, err := net.SplitHostPort(in.RemoteAddr); err == nil {
		if prior := in.Header.Values("X-Forwarded-For"); len(prior) > 0 {
			ip = joinComma(prior) + ", " + ip
		}
		out.Header.Set("X-Forwarded-For", ip)
	}
	out.Header.Set("X-Forwarded-Host", in.Host)
	proto := "http"
	if in.TLS != nil {
		proto = "https"
	}
	out.Header.Set("X-Forwarded-Proto", proto)
	p.secret.Sign(out.Header, out.Method, out.URL.RequestURI(), principal, time.Now())
	resp, err := p.tr.RoundTrip(out)
	if err != nil {
		if notSent(err) {
			return nil, fmt.Errorf("%w (%w, %s): %v", ErrUnreachable, ErrNotSent, target.Host, err)
		}
		return nil, fmt.Errorf("%w (%s): %v", ErrUnreachable, target.Host, err)
	}
	return resp, nil
}

func joinComma(v []string) string {
	var b bytes.Buffer
	for i, s := range v {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(s)
	}
	return b.String()
}

// notSent reports whether err says the request never left: the dial
// failed (refused, no route, timed out connecting).
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

package forward

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// Header carries a forwarded request's proof: when it was signed, the
// principal the forwarding replica authenticated, and an HMAC-SHA256 of
// both with the request's method and URI under the cluster secret:
//
//	Kernelgate-Forwarded: t=<unix seconds>;p=<base64url principal>;s=<base64url HMAC>
const Header = "Kernelgate-Forwarded"

// MaxSkew is how far a forwarded request's time may be from the
// receiver's clock, either way; older (or later) ones are refused.
const MaxSkew = 30 * time.Second

// MinSecretBytes is the shortest cluster secret accepted.
const MinSecretBytes = 32

var (
	// ErrSecretTooShort: the cluster secret has fewer than MinSecretBytes
	// bytes once surrounding whitespace is trimmed.
	ErrSecretTooShort = errors.New("forward: the cluster secret is too short")
	// ErrNoSecret: a forwarded request reached a replica with no cluster
	// secret, which can verify nothing.
	ErrNoSecret = errors.New("forward: this replica has no cluster secret")
	// ErrBadSignature: the Header is malformed or its signature does not
	// match the request.
	ErrBadSignature = errors.New("forward: the forwarded request's signature does not check")
	// ErrStale: the signature is older (or later) than MaxSkew.
	ErrStale = errors.New("forward: the forwarded request's signature is too old")
)

// Secret is the cluster secret replicas sign forwarded requests with. Its
// bytes are never printed: String and LogValue hide them.
type Secret struct {
	key []byte
}

// NewSecret makes a Secret of b, surrounding whitespace trimmed; it must
// have at least MinSecretBytes bytes.
func NewSecret(b []byte) (*Secret, error) {
	b = bytes.TrimSpace(b)
	if len(b) < MinSecretBytes {
		return nil, fmt.Errorf("%w: %d bytes, at least %d (e.g. head -c 32 /dev/urandom | base64)", ErrSecretTooShort, len(b), MinSecretBytes)
	}
	return &Secret{key: bytes.Clone(b)}, nil
}

// LoadSecret reads a Secret from a file (--cluster-secret-file).
func LoadSecret(path string) (*Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("forward: reading the cluster secret: %w", err)
	}
	s, err := NewSecret(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// String hides the secret.
func (s *Secret) String() string { return "[cluster secret]" }

// LogValue hides the secret from slog.
func (s *Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// mac is the signature of one forwarded request.
func (s *Secret) mac(method, uri, unix, principal string) []byte {
	m := hmac.New(sha256.New, s.key)
	for _, part := range []string{"kernelgate-forward/1", method, uri, unix, principal} {
		m.Write([]byte(part))
		m.Write([]byte{'\n'})
	}
	return m.Sum(nil)
}

// Sign sets Header on h for a request of method to uri (its path and
// query as sent on the wire) on behalf of principal, at now.
func (s *Secret) Sign(h http.Header, method, uri string, principal []byte, now time.Time) {
	unix := strconv.FormatInt(now.Unix(), 10)
	p := base64.RawURLEncoding.EncodeToString(principal)
	sig := base64.RawURLEncoding.EncodeToString(s.mac(method, uri, unix, p))
	h.Set(Header, "t="+unix+";p="+p+";s="+sig)
}

// Verify checks the Header of r, a request as the server received it, at
// now, and returns the principal it carries. A nil Secret verifies nothing
// (ErrNoSecret).
func (s *Secret) Verify(r *http.Request, now time.Time) ([]byte, error) {
	if s == nil {
		return nil, ErrNoSecret
	}
	var unix, p, sig string
	for _, field := range strings.Split(r.Header.Get(Header), ";") {
		k, v, _ := strings.Cut(field, "=")
		switch k {
		case "t":
			unix = v
		case "p":
			p = v
		case "s":
			sig = v
		}
	}
	t, err := strconv.ParseInt(unix, 10, 64)
	if err != nil {
		return nil, ErrBadSignature
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.mac(r.Method, requestURI(r), unix, p)) {
		return nil, ErrBadSignature
	}
	if d := now.Sub(time.Unix(t, 0)); d > MaxSkew || d < -MaxSkew {
		return nil, fmt.Errorf("%w: signed %v from this replica's clock (at most %v)", ErrStale, d.Round(time.Second), MaxSkew)
	}
	principal, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil {
		return nil, ErrBadSignature
	}
	return principal, nil
}

// requestURI is r's path and query as received; a request built in
// process (tests) has only its URL.
func requestURI(r *http.Request) string {
	if r.RequestURI != "" {
		return r.RequestURI
	}
	return r.URL.RequestURI()
}

// Forwarded reports whether a request's headers claim it was forwarded by
// a replica (they carry Header, valid or not).
func Forwarded(h http.Header) bool { return len(h[Header]) > 0 }

// Principal is the principal r's Header carries, without verifying it:
// only for a request whose Verify has passed, where its headers alone
// are at hand.
func Principal(h http.Header) ([]byte, bool) {
	for _, field := range strings.Split(h.Get(Header), ";") {
		if v, ok := strings.CutPrefix(field, "p="); ok {
			b, err := base64.RawURLEncoding.DecodeString(v)
			return b, err == nil
		}
	}
	return nil, false
}

package forward

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const testSecret = "0123456789abcdef0123456789abcdef"

func mustSecret(t *testing.T, s string) *Secret {
	t.Helper()
	sec, err := NewSecret([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return sec
}

func TestSecretLoading(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, content string
		err           error
	}{
		{"exact", testSecret, nil},
		{"trimmed", "\n  " + testSecret + "  \n", nil},
		{"short", "  " + testSecret[:31] + "\n\n\n\n", ErrSecretTooShort},
		{"empty", "", ErrSecretTooShort},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := LoadSecret(write(tt.name, tt.content))
			if !errors.Is(err, tt.err) {
				t.Fatalf("LoadSecret: %v, want %v", err, tt.err)
			}
			if err != nil {
				return
			}
			// Whitespace around it is not part of it: the file's secret
			// and the bare one sign alike.
			h := http.Header{}
			s.Sign(h, "GET", "/x", nil, time.Now())
			r := httptest.NewRequest("GET", "/x", nil)
			r.Header = h
			if _, err := mustSecret(t, testSecret).Verify(r, time.Now()); err != nil {
				t.Fatalf("a secret read from a file does not verify against the bare one: %v", err)
			}
		})
	}
	if _, err := LoadSecret(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing file gave a secret")
	}
}

func TestSecretIsNeverPrinted(t *testing.T) {
	s := mustSecret(t, testSecret)
	var b strings.Builder
	slog.New(slog.NewTextHandler(&b, nil)).Info("config", "secret", s)
	fmt.Fprintf(&b, "%v %s %+v", s, s, s)
	if strings.Contains(b.String(), testSecret) {
		t.Fatalf("the secret was printed: %s", b.String())
	}
}

func TestSignVerify(t *testing.T) {
	s := mustSecret(t, testSecret)
	now := time.Unix(1_800_000_000, 0)
	signed := func() *http.Request {
		r := httptest.NewRequest("POST", "/api/contexts/c1/files/a.txt?x=1", nil)
		s.Sign(r.Header, "POST", "/api/contexts/c1/files/a.txt?x=1", []byte(`{"n":"alice"}`), now)
		return r
	}
	if p, err := s.Verify(signed(), now.Add(MaxSkew)); err != nil || string(p) != `{"n":"alice"}` {
		t.Fatalf("Verify = %q, %v; want the principal", p, err)
	}
	tests := []struct {
		name   string
		change func(r *http.Request) *http.Request
		secret *Secret
		at     time.Time
		want   error
	}{
		{"other method", func(r *http.Request) *http.Request { r.Method = "DELETE"; return r }, s, now, ErrBadSignature},
		{"other path", func(r *http.Request) *http.Request { r.RequestURI = "/api/contexts/c2/files/a.txt?x=1"; return r }, s, now, ErrBadSignature},
		{"other query", func(r *http.Request) *http.Request { r.RequestURI = "/api/contexts/c1/files/a.txt?x=2"; return r }, s, now, ErrBadSignature},
		{"other principal", func(r *http.Request) *http.Request {
			v := r.Header.Get(Header)
			i := strings.Index(v, ";p=")
			j := strings.Index(v, ";s=")
			r.Header.Set(Header, v[:i]+";p=eyJuIjoicm9vdCJ9"+v[j:])
			return r
		}, s, now, ErrBadSignature},
		{"other time", func(r *http.Request) *http.Request {
			r.Header.Set(Header, strings.Replace(r.Header.Get(Header), "t=1800000000", "t=1800000001", 1))
			return r
		}, s, now, ErrBadSignature},
		{"other secret", nil, mustSecret(t, strings.Repeat("z", 32)), now, ErrBadSignature},
		{"no secret here", nil, nil, now, ErrNoSecret},
		{"too old", nil, s, now.Add(MaxSkew + time.Second), ErrStale},
		{"from the future", nil, s, now.Add(-MaxSkew - time.Second), ErrStale},
		{"garbage", func(r *http.Request) *http.Request { r.Header.Set(Header, "t=x;p=;s=!!"); return r }, s, now, ErrBadSignature},
		{"absent", func(r *http.Request) *http.Request { r.Header.Del(Header); return r }, s, now, ErrBadSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := signed()
			if tt.change != nil {
				r = tt.change(r)
			}
			if p, err := tt.secret.Verify(r, tt.at); !errors.Is(err, tt.want) {
				t.Fatalf("Verify = %q, %v; want %v", p, err, tt.want)
			}
		})
	}
}

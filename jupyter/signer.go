package jupyter

import (
	"crypto/hmac"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"strings"
	"sync"
)

// DefaultReplayHistory is how many recent signatures a Signer remembers to
// reject replays.
const DefaultReplayHistory = 16384

// Signer signs and verifies messages with the HMAC of a connection's
// signature_scheme and key. An empty key means messages are unsigned. A
// Signer also remembers recent signatures and rejects one seen twice.
// It is safe for concurrent use.
type Signer struct {
	key     []byte
	newHash func() hash.Hash
	pool    sync.Pool

	mu    sync.Mutex
	limit int
	seen  map[uint64]struct{}
	ring  []uint64 // grows to limit, then wraps at next
	next  int
}

// NewSigner returns a Signer for scheme (e.g. "hmac-sha256") and key,
// remembering up to history signatures (0 means DefaultReplayHistory).
func NewSigner(scheme string, key []byte, history int) (*Signer, error) {
	if history <= 0 {
		history = DefaultReplayHistory
	}
	s := &Signer{key: key, limit: history, seen: make(map[uint64]struct{})}
	if len(key) == 0 {
		return s, nil
	}
	alg, ok := strings.CutPrefix(scheme, "hmac-")
	if !ok && scheme != "" {
		return nil, fmt.Errorf("%w: %q", ErrUnsupportedScheme, scheme)
	}
	switch alg {
	case "sha256", "":
		s.newHash = sha256.New
	case "sha512":
		s.newHash = sha512.New
	case "sha384":
		s.newHash = sha512.New384
	case "sha224":
		s.newHash = sha256.New224
	case "sha1":
		s.newHash = sha1.New
	case "md5":
		s.newHash = md5.New
	default:
		return nil, fmt.Errorf("%w: %q", ErrUnsupportedScheme, scheme)
	}
	s.pool.New = func() any { return hmac.New(s.newHash, s.key) }
	return s, nil
}

// Signed reports whether messages carry signatures.
func (s *Signer) Signed() bool { return len(s.key) > 0 }

func (s *Signer) digest(parts *[4][]byte) []byte {
	h := s.pool.Get().(hash.Hash)
	h.Reset()
	for _, p := range parts {
		h.Write(p)
	}
	d := h.Sum(nil)
	s.pool.Put(h)
	return d
}

// Sign returns the lowercase hex signature of the four JSON parts (header,
// parent header, metadata, content), or an empty slice when unsigned.
func (s *Signer) Sign(parts *[4][]byte) []byte {
	if !s.Signed() {
		return []byte{}
	}
	d := s.digest(parts)
	out := make([]byte, hex.EncodedLen(len(d)))
	hex.Encode(out, d)
	return out
}

// Verify checks sig against the four parts and rejects a signature seen
// before. Unsigned connections accept any signature.
func (s *Signer) Verify(sig []byte, parts *[4][]byte) error {
	if !s.Signed() {
		return nil
	}
	return s.check(sig, s.digest(parts))
}

// hasher returns a fresh HMAC of the connection's key, for a message whose
// parts are hashed as they are read (check then verifies it); nil when
// unsigned.
func (s *Signer) hasher() hash.Hash {
	if !s.Signed() {
		return nil
	}
	return hmac.New(s.newHash, s.key)
}

// check verifies sig against the digest want of a message's parts and
// rejects a signature seen before.
func (s *Signer) check(sig, want []byte) error {
	if len(sig) != hex.EncodedLen(len(want)) {
		return ErrInvalidSignature
	}
	got := make([]byte, len(want))
	if _, err := hex.Decode(got, sig); err != nil || !hmac.Equal(got, want) {
		return ErrInvalidSignature
	}
	return s.remember(binary.LittleEndian.Uint64(want))
}

// remember records a digest prefix and fails if it was already there.
func (s *Signer) remember(d uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.seen[d]; dup {
		return ErrReplayedSignature
	}
	s.seen[d] = struct{}{}
	if len(s.ring) < s.limit {
		s.ring = append(s.ring, d)
		return nil
	}
	delete(s.seen, s.ring[s.next])
	s.ring[s.next] = d
	s.next = (s.next + 1) % len(s.ring)
	return nil
}

// Package tailbuf keeps the end of what a process writes: the last bytes
// of a kernel's or a server's output, for the error that says why it
// stopped.
package tailbuf

import "sync"

// Buffer keeps the last n bytes written to it; it is safe for concurrent
// use.
type Buffer struct {
	mu  sync.Mutex
	n   int
	buf []byte
}

// New returns a Buffer of n bytes (8 KiB when n <= 0).
func New(n int) *Buffer {
	if n <= 0 {
		n = 8 << 10
	}
	return &Buffer{n: n}
}

func (t *Buffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(p) >= t.n {
		t.buf = append(t.buf[:0], p[len(p)-t.n:]...)
		return len(p), nil
	}
	if over := len(t.buf) + len(p) - t.n; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return len(p), nil
}

// String returns the bytes kept.
func (t *Buffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

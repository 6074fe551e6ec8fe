package tailbuf

import (
	"strings"
	"testing"
)

func TestKeepsTheLastBytes(t *testing.T) {
	b := New(8)
	b.Write([]byte("abc"))
	b.Write([]byte("defgh"))
	if got := b.String(); got != "abcdefgh" {
		t.Fatalf("after 8 bytes: %q", got)
	}
	b.Write([]byte("ij"))
	if got := b.String(); got != "cdefghij" {
		t.Fatalf("after 10 bytes: %q", got)
	}
	n, err := b.Write([]byte(strings.Repeat("x", 20) + "12345678"))
	if n != 28 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if got := b.String(); got != "12345678" {
		t.Fatalf("after a write longer than the buffer: %q", got)
	}
	if New(0).n != 8<<10 {
		t.Fatal("default size is not 8 KiB")
	}
}

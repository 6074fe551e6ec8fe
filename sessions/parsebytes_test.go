package sessions

import (
	"strings"
	"testing"
)

// ParseBytes takes what --kernel-memory, --max-upload, --max-kernel-message
// and metadata.kernelgate.memory document: bytes, or a number (with a
// fraction) and a unit, KiB to TiB (K, M, G alike) in powers of 1024, KB
// to TB in powers of 1000. A size past int64, a negative one, a lowercase
// or unknown unit is refused, saying why.
func TestParseBytes(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"0", 0},
		{"12345", 12345},
		{" 4GiB ", 4 << 30},
		{"512MiB", 512 << 20},
		{"512 MiB", 512 << 20},
		{"1KiB", 1024},
		{"2TiB", 2 << 40},
		{"1.5GiB", 3 << 29},
		{"0.5KiB", 512},
		{"512M", 512 << 20},
		{"2G", 2 << 30},
		{"64K", 64 << 10},
		{"1KB", 1000},
		{"2.5MB", 2500000},
		{"3GB", 3e9},
		{"1TB", 1e12},
		{"100B", 100},
		{"8388607TiB", 8388607 << 40},
		{"9223372036854775807", 1<<63 - 1},
		{"9223372036854775807B", 1<<63 - 1},
		{"1.0001KiB", 1025}, // rounded up to a whole byte
	} {
		got, err := ParseBytes(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, c := range []struct{ in, why string }{
		{"", "bad size"},
		{"9223372036854775808", "too large"},
		{"8388608TiB", "too large"},
		{"1e30GiB", "bad size"},
		{"100000000000000000000GB", "too large"},
		{"-1", "negative"},
		{"-1GiB", "negative"},
		{"512m", "case"},
		{"2g", "case"},
		{"1kib", "case"},
		{"1mb", "case"},
		{"1Ki", "bad size"},
		{"1EiB", "bad size"},
		{"1.5", "bad size"}, // bytes are whole without a unit
		{"NaNGiB", "bad size"},
		{"InfGiB", "bad size"},
		{"0x10KiB", "bad size"},
		{"GiB", "bad size"},
		{"1 2MiB", "bad size"},
	} {
		got, err := ParseBytes(c.in)
		if err == nil {
			t.Errorf("ParseBytes(%q) = %d, want an error", c.in, got)
		} else if !strings.Contains(err.Error(), c.why) {
			t.Errorf("ParseBytes(%q): %v; want it to say %q", c.in, err, c.why)
		}
	}
}

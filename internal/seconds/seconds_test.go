package seconds

import (
	"math"
	"testing"
	"time"
)

func TestOf(t *testing.T) {
	const max = 24 * time.Hour
	for _, c := range []struct {
		s    float64
		want time.Duration
		ok   bool
	}{
		{0, 0, true},
		{0.05, 50 * time.Millisecond, true},
		{1e-12, time.Nanosecond, true}, // not 0, "no limit"
		{60, time.Minute, true},
		{86400, max, true},
		{86400.0000001, 0, false},
		{-1, 0, false},
		{1e10, 0, false},  // 1e19 ns: past int64
		{9.3e9, 0, false}, // 9.3e18 ns: wraps to a time in 1734
		{1e300, 0, false},
		{math.Inf(1), 0, false},
		{math.NaN(), 0, false},
	} {
		d, ok := Of(c.s, max)
		if d != c.want || ok != c.ok {
			t.Errorf("Of(%v) = %v, %v; want %v, %v", c.s, d, ok, c.want, c.ok)
		}
	}
	// The largest bound a Duration allows converts without wrapping.
	if d, ok := Of(math.MaxInt64/1e9, math.MaxInt64); !ok || d <= 0 {
		t.Errorf("Of(max) = %v, %v", d, ok)
	}
	if got := Format(max); got != "86400" {
		t.Errorf("Format = %q", got)
	}
}

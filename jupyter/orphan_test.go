package jupyter

import (
	"testing"
	"time"
)

// Kernels started at different moments renew their leases at the same
// instants (one wakeup of the gateway for all), never more than a period
// apart.
func TestLeaseRenewalsAreAligned(t *testing.T) {
	every := 5 * time.Minute
	base := time.Date(2026, 12, 5, 6, 0, 0, 0, time.UTC) // a multiple of every
	for _, offset := range []time.Duration{0, time.Nanosecond, 17 * time.Second, 2*time.Minute + 3*time.Millisecond, every - time.Nanosecond} {
		now := base.Add(offset)
		wait := untilNextMultiple(now, every)
		if wait <= 0 || wait > every {
			t.Fatalf("at %v: next renewal in %v, want within (0, %v]", now, wait, every)
		}
		if at := now.Add(wait); !at.Equal(base.Add(every)) {
			t.Errorf("started at +%v: renews at %v, not with the others at %v", offset, at, base.Add(every))
		}
	}
}

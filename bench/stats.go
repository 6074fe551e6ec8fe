//go:build linux

package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// sample is a set of measured durations.
type sample []time.Duration

// pct returns the nearest-rank percentile p (0–100) of s, or 0 for an
// empty sample.
func (s sample) pct(p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	i := int(math.Ceil(p/100*float64(len(c)))) - 1
	return c[min(max(i, 0), len(c)-1)]
}

func (s sample) p50() time.Duration { return s.pct(50) }
func (s sample) p90() time.Duration { return s.pct(90) }
func (s sample) p99() time.Duration { return s.pct(99) }

// paired returns the median of the differences a[i] - b[i] of two samples
// taken in pairs; slow drift of the machine's load affects it less than the
// difference of the two medians.
func paired(a, b sample) time.Duration { return diffs(a, b).p50() }

// diffs is a[i] - b[i] for the pairs of two samples.
func diffs(a, b sample) sample {
	d := make(sample, min(len(a), len(b)))
	for i := range d {
		d[i] = a[i] - b[i]
	}
	return d
}

// pairedCI is the 95 % confidence interval of paired(a, b): the order
// statistics of the differences at ranks n/2 ∓ 0.98·√n, which hold for
// any distribution of the differences.
func pairedCI(a, b sample) (lo, hi time.Duration) {
	d := diffs(a, b)
	n := len(d)
	if n == 0 {
		return 0, 0
	}
	slices.Sort(d)
	h := 0.98 * math.Sqrt(float64(n))
	i := max(int(math.Floor(float64(n)/2-h)), 0)
	j := min(int(math.Ceil(float64(n)/2+h)), n-1)
	return d[i], d[j]
}

// fmtPaired is paired(a, b) with its confidence interval.
func fmtPaired(a, b sample) string {
	lo, hi := pairedCI(a, b)
	return fmtDiff(paired(a, b)) + " (95 % CI " + fmtDiff(lo) + " to " + fmtDiff(hi) + ")"
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fmtMS formats a duration in ms with precision that suits its size.
func fmtMS(d time.Duration) string {
	v := ms(d)
	switch {
	case math.Abs(v) < 10:
		return fmt.Sprintf("%.2f", v)
	case math.Abs(v) < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// lat formats the p50 / p90 of a sample with its size.
func lat(s sample) string {
	if len(s) == 0 {
		return "—"
	}
	return fmt.Sprintf("%s / %s ms (n=%d)", fmtMS(s.p50()), fmtMS(s.p90()), len(s))
}

// ratio formats a/b, or "—" when either is missing.
func ratio(a, b float64) string {
	if a <= 0 || b <= 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "—"
	}
	r := a / b
	if r >= 10 {
		return fmt.Sprintf("%.1f×", r)
	}
	return fmt.Sprintf("%.2f×", r)
}

// missingNote says how many runs completed without their result.
func missingNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; %d without their result", n)
}

// lateNote says how many round trips' results came after reply and idle.
func lateNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; %d results after idle", n)
}

// fmtDiff formats a signed difference in ms.
func fmtDiff(d time.Duration) string {
	if v := ms(d); math.Abs(v) < 10 {
		return fmt.Sprintf("%+.3f ms", v)
	}
	return fmt.Sprintf("%+.1f ms", ms(d))
}

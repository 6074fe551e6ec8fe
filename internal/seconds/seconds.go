// Package seconds reads the durations clients send as JSON numbers of
// seconds. A float64 of seconds times a billion does not fit a
// time.Duration past about 292 years, and Go's conversion of such a float
// to an integer gives a negative or meaningless duration: every duration
// from a client goes through Of, which bounds the number before
// converting it.
package seconds

import (
	"math"
	"strconv"
	"time"
)

// Of is s seconds as a Duration, with ok true when s is a number from 0
// to max (NaN, infinities, negative numbers and numbers past max are
// not). A number above 0 stays above 0 (a nanosecond at least): 0 often
// means "no limit".
func Of(s float64, max time.Duration) (d time.Duration, ok bool) {
	if math.IsNaN(s) || s < 0 || s > max.Seconds() {
		return 0, false
	}
	ns := math.Round(s * float64(time.Second))
	if ns >= float64(max) { // max.Seconds() rounded up
		return max, true
	}
	if ns < 1 && s > 0 {
		return 1, true
	}
	return time.Duration(ns), true
}

// Format writes d as a number of seconds for a message ("86400").
func Format(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
}

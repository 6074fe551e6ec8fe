// Package timefmt writes every time kernelgate sends: in its API (the
// contract's RFC 3339 in UTC with exactly 6 fractional digits and Z, which
// Jupyter Server's GatewayClient parses strictly) and in the headers of
// the Jupyter messages it makes (the same form jupyter_client writes).
package timefmt

import "time"

// Layout is the one format: 2026-01-02T03:04:05.123456Z.
const Layout = "2006-01-02T15:04:05.000000Z"

// Format writes t in Layout, converted to UTC.
func Format(t time.Time) string { return t.UTC().Format(Layout) }

// Parse reads a time written by Format.
func Parse(s string) (time.Time, error) { return time.Parse(Layout, s) }

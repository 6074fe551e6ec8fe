package local

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// A lease renewal that fails is logged once and tried again until one
// succeeds, which is logged too: the watchdog would stop the kernel once
// the lease it reads has run out.
func TestFailedLeaseRenewalIsLoggedAndTriedAgain(t *testing.T) {
	dir := t.TempDir()
	records := make(chan slog.Record, 16)
	g, err := newGuard(dir, 3*time.Second, slog.New(recordHandler(records)))
	if err != nil {
		t.Fatal(err)
	}
	defer g.release()
	// Writing the new lease fails while its temporary name is a directory.
	tmp := filepath.Join(dir, leaseFileName+".new")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	next := func(what string) slog.Record {
		t.Helper()
		select {
		case r := <-records:
			return r
		case <-time.After(10 * time.Second):
			t.Fatalf("no log record: %s", what)
			return slog.Record{}
		}
	}
	if r := next("the failed renewal"); r.Level != slog.LevelWarn || !strings.Contains(r.Message, "not renewed") {
		t.Fatalf("first record %v %q, want a warning that the lease was not renewed", r.Level, r.Message)
	}
	if err := os.Remove(tmp); err != nil {
		t.Fatal(err)
	}
	if r := next("the renewal that succeeds"); r.Level != slog.LevelInfo || !strings.Contains(r.Message, "renewed again") {
		t.Fatalf("second record %v %q, want that the lease was renewed again (one warning for the failures)", r.Level, r.Message)
	}
	b, err := os.ReadFile(filepath.Join(dir, leaseFileName))
	if err != nil {
		t.Fatal(err)
	}
	until, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Now().Unix() + 2; until < want {
		t.Errorf("lease until %d after the renewal, want at least %d (now + the 3 s timeout, to the second)", until, want)
	}
}

// recordHandler sends every record to records.
type recordHandler chan<- slog.Record

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	h <- r.Clone()
	return nil
}
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordHandler) WithGroup(string) slog.Handler      { return h }

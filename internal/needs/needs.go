// Package needs lets a test skip for want of something the machine lacks
// (bubblewrap, writable cgroups, root, a directory outside /tmp), except
// where the machine is known to have it all: with KERNELGATE_REQUIRE_ALL=1
// (set by CI, whose machine has every facility) such a skip fails the test,
// so a broken facility cannot hide a failure.
package needs

import (
	"fmt"
	"os"
	"testing"
)

// Env is the switch: "1" turns a missing facility into a failure.
const Env = "KERNELGATE_REQUIRE_ALL"

// Required reports whether the switch is on.
func Required() bool { return os.Getenv(Env) == "1" }

// Skip skips t for want of a facility, or fails it when Required.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if Required() {
		t.Fatalf("%s (and %s=1 says this machine has every facility the tests need)", why, Env)
		return
	}
	t.Skip(why)
}

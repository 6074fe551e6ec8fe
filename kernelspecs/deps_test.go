package kernelspecs

import (
	"testing"

	"kernelgate/internal/importcheck"
)

// TestStdlibOnly fails if a non-test file imports anything outside the
// standard library.
func TestStdlibOnly(t *testing.T) {
	importcheck.StdlibOnly(t, "kernelspecs uses the standard library only")
}

package forward

import (
	"testing"

	"kernelgate/internal/importcheck"
)

// TestStdlibOnly fails if a non-test file imports anything outside the
// standard library.
func TestStdlibOnly(t *testing.T) {
	importcheck.StdlibOnly(t, "forward knows no kernels, routes or frameworks: the standard library only")
}

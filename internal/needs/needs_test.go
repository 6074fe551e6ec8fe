package needs

import (
	"fmt"
	"strings"
	"testing"
)

// recorder stands for a test: it records whether Skip skipped or failed.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Skip(args ...any)                  { r.skipped = args[0].(string) }
func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestSkipFailsWhenRequired(t *testing.T) {
	t.Setenv(Env, "")
	r := &recorder{}
	Skip(r, "no %s here", "bwrap")
	if r.skipped != "no bwrap here" || r.failed != "" {
		t.Errorf("without the switch: skipped %q, failed %q", r.skipped, r.failed)
	}
	t.Setenv(Env, "1")
	r = &recorder{}
	Skip(r, "no %s here", "bwrap")
	if r.skipped != "" || !strings.Contains(r.failed, "every facility") {
		t.Errorf("with the switch: skipped %q, failed %q", r.skipped, r.failed)
	}
}

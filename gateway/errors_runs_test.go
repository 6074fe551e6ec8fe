package gateway

import (
	"fmt"
	"net/http"
	"testing"

	"kernelgate/runs"
	"kernelgate/sessions"
)

// The errors of runs map to the status and code their sessions
// counterparts had: a full queue, a deleted context's queue, a run not
// waiting for input, an unknown run.
func TestRunsErrorsKeepTheirStatusAndCode(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
		code   string
	}{
		{&runs.Error{Kind: runs.ErrQueueFull, Msg: "full"}, http.StatusTooManyRequests, "QUEUE_FULL"},
		{&runs.Error{Kind: runs.ErrQueueClosed, Msg: "deleted"}, http.StatusNotFound, "SESSION_NOT_FOUND"},
		{&runs.Error{Kind: runs.ErrNotAwaitingInput, Msg: "not waiting"}, http.StatusBadRequest, "BAD_REQUEST"},
		{&runs.Error{Kind: runs.ErrNoSuchRun, Msg: "no run"}, http.StatusNotFound, "NOT_FOUND"},
		{fmt.Errorf("wrapped: %w", &runs.Error{Kind: runs.ErrQueueFull, Msg: "full"}), http.StatusTooManyRequests, "QUEUE_FULL"},
		{&sessions.Error{Kind: sessions.ErrNoSuchContext, Msg: "gone"}, http.StatusNotFound, "SESSION_NOT_FOUND"},
	} {
		ae := classify(c.err)
		if ae.status != c.status || ae.code != c.code {
			t.Errorf("%v: got %d %s, want %d %s", c.err, ae.status, ae.code, c.status, c.code)
		}
		if ae.msg != c.err.Error() {
			t.Errorf("%v: message %q", c.err, ae.msg)
		}
	}
}

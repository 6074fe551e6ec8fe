package e2b

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"kernelgate/state"
)

// logWatch is a slog handler that hands each message to a channel.
type logWatch struct{ msgs chan string }

func (l logWatch) Enabled(context.Context, slog.Level) bool { return true }
func (l logWatch) Handle(_ context.Context, r slog.Record) error {
	select {
	case l.msgs <- r.Message:
	default:
	}
	return nil
}
func (l logWatch) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l logWatch) WithGroup(string) slog.Handler      { return l }

// TestSandboxOfAnotherReplica: with replicas (Config.Owned), a sandbox
// another replica owns is not killed here when its timeout runs out (its
// record, context and kernel stay, for its owner to time out), and a
// restore leaves its record to its owner instead of dropping it for
// having no context here.
func TestSandboxOfAnotherReplica(t *testing.T) {
	store := state.NewMemory()
	m := newStoredManager(t, store)
	var (
		mu     sync.Mutex
		others = map[string]bool{} // sandboxes another replica owns
	)
	owned := func(_ context.Context, id string) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return !others[id], nil
	}
	logs := logWatch{msgs: make(chan string, 64)}
	h := New(Config{Owned: owned, Logger: slog.New(logs)}, m)
	url := serve(t, h)

	id, tok, _ := create(t, url, `{"timeout": 600}`)
	if _, out := runCode(t, url, id, tok, "x = 41"); out != "" {
		t.Fatalf("x = 41: %s", out)
	}
	mu.Lock()
	others[id] = true // its kernel's lease went to another replica
	mu.Unlock()
	if status, out := send(t, "POST", url+"/sandboxes/"+id+"/timeout", `{"timeout": 1}`, apiKey); status != http.StatusNoContent {
		t.Fatalf("set timeout: %d %s", status, out)
	}
	deadline := time.After(30 * time.Second)
	for decided := false; !decided; {
		select {
		case msg := <-logs.msgs:
			decided = strings.HasPrefix(msg, "e2b sandbox timed out")
		case <-deadline:
			t.Fatal("the sandbox's timeout did not run out in 30 s")
		}
	}
	if _, ok := record(t, store, id); !ok || !hasContext(m, id) {
		t.Fatalf("a sandbox another replica owns, timed out here: record kept %v, context kept %v; want both", ok, hasContext(m, id))
	}

	foreign := "kg" + strings.Repeat("1", 2*idBytes)
	mu.Lock()
	others[foreign] = true
	mu.Unlock()
	store.PutSandbox(context.Background(), state.Sandbox{ID: foreign, Ends: time.Now().Add(time.Hour)})
	h2 := New(Config{Owned: owned}, m)
	rep, err := h2.Restore(context.Background())
	if err != nil || rep.Dropped != 0 || rep.Elsewhere != 2 {
		t.Fatalf("restore: %+v, %v; want nothing dropped, 2 sandboxes left to their owner", rep, err)
	}
	if _, ok := record(t, store, foreign); !ok {
		t.Error("restore deleted the record of a sandbox another replica owns")
	}
	h2.Close()
}

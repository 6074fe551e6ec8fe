package e2b

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kernelgate/internal/testkernels"
	"kernelgate/internal/timefmt"
	"kernelgate/kernelspecs"
	"kernelgate/provision/local"
	"kernelgate/sessions"
	"kernelgate/state"
	"kernelgate/workspace"
)

// newStoredManager is a manager of real Python kernels keeping its
// records in store, its workspaces under a root of the test.
func newStoredManager(t *testing.T, store state.Store) *sessions.Manager {
	t.Helper()
	testkernels.Spec(t, "python3")
	root, err := workspace.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	runtime := t.TempDir()
	if err := os.Chmod(filepath.Dir(runtime), 0o711); err != nil {
		t.Fatal(err)
	}
	m := sessions.New(sessions.Config{Store: store, Workspaces: root, PoolSize: 0},
		kernelspecs.Load([]string{testkernels.Dir(t)}), &local.Provisioner{RuntimeDir: runtime}, nil)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		m.Close(ctx)
	})
	return m
}

// serve serves h for the test; the handler's Close is the test's too.
func serve(t *testing.T, h *Handler) string {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(func() { s.Close(); h.Close() })
	return s.URL
}

// send makes a request with headers and returns status and body.
func send(t *testing.T, method, url, body string, headers map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var apiKey = map[string]string{"X-API-KEY": "key-0123456789"}

// create makes a sandbox and returns its id, token and end.
func create(t *testing.T, url, body string) (id, token, end string) {
	t.Helper()
	status, out := send(t, "POST", url+"/sandboxes", body, apiKey)
	if status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, out)
	}
	var sb struct{ SandboxID, EnvdAccessToken, EndAt string }
	json.Unmarshal([]byte(out), &sb)
	return sb.SandboxID, sb.EnvdAccessToken, sb.EndAt
}

// runCode runs code in the sandbox's Python context and returns the text
// of its result or error, and the status.
func runCode(t *testing.T, url, id, token, code string) (int, string) {
	t.Helper()
	js, _ := json.Marshal(map[string]string{"code": code})
	status, out := send(t, "POST", url+"/execute", string(js), map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": token})
	if status != http.StatusOK {
		return status, out
	}
	for _, line := range strings.Split(out, "\n") {
		var ev struct{ Type, Text, Name string }
		json.Unmarshal([]byte(line), &ev)
		switch ev.Type {
		case "result":
			return status, ev.Text
		case "error":
			return status, ev.Name
		}
	}
	return status, ""
}

func record(t *testing.T, store state.Store, id string) (state.Sandbox, bool) {
	t.Helper()
	snap, err := store.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range snap.Sandboxes {
		if rec.ID == id {
			return rec, true
		}
	}
	return state.Sandbox{}, false
}

func hasContext(m *sessions.Manager, id string) bool {
	_, err := m.Context(contextPrefix(id) + "python")
	return err == nil
}

// TestSandboxesKeptInTheStore: a sandbox's record is in the store when
// the call that made or changed it answers, with its tokens hashed; a
// handler started again over the same manager and store (what a restart
// does once the manager restored the contexts) serves it with its state
// and tokens; one whose timeout ran out, one whose contexts are gone and
// contexts without a sandbox are dropped; a kill deletes the record, a
// Close with a store keeps it.
func TestSandboxesKeptInTheStore(t *testing.T) {
	store := state.NewMemory()
	m := newStoredManager(t, store)
	h := New(Config{}, m)
	url := serve(t, h)

	id, tok, end := create(t, url, `{"timeout": 600, "metadata": {"owner": "a"}}`)
	rec, ok := record(t, store, id)
	js, _ := json.Marshal(rec)
	if !ok || rec.Metadata["owner"] != "a" || len(rec.TokenHashes) != 1 || rec.TokenHashes[0] != sha256.Sum256([]byte(tok)) ||
		strings.Contains(string(js), tok) || timefmt.Format(rec.Ends) != end {
		t.Fatalf("record of sandbox %s (token %s, end %s): %s", id, tok, end, js)
	}
	if status, out := send(t, "POST", url+"/sandboxes/"+id+"/timeout", `{"timeout": 900}`, apiKey); status != http.StatusNoContent {
		t.Fatalf("set timeout: %d %s", status, out)
	}
	if rec, _ := record(t, store, id); time.Until(rec.Ends) < 800*time.Second {
		t.Fatalf("the record's end after a timeout of 900 s: %v", rec.Ends)
	}
	if _, out := runCode(t, url, id, tok, "x = 41"); out != "" {
		t.Fatalf("x = 41: %s", out)
	}

	expired, _, _ := create(t, url, `{"timeout": 600}`)
	rec, _ = record(t, store, expired)
	rec.Ends = time.Now().Add(-time.Second)
	store.PutSandbox(context.Background(), rec)
	orphan, _, _ := create(t, url, `{"timeout": 600}`)
	store.DeleteSandbox(context.Background(), orphan)
	empty := "kg" + strings.Repeat("0", 2*idBytes)
	store.PutSandbox(context.Background(), state.Sandbox{ID: empty, Ends: time.Now().Add(time.Hour)})
	h.Close() // with a store: kills nothing

	h2 := New(Config{}, m)
	rep, err := h2.Restore(context.Background())
	if err != nil || rep != (RestoreReport{Restored: 1, Dropped: 2, Orphans: 1}) {
		t.Fatalf("restore: %+v, %v", rep, err)
	}
	url2 := serve(t, h2)
	if status, out := send(t, "GET", url2+"/sandboxes/"+id, "", apiKey); status != http.StatusOK || !strings.Contains(out, `"owner":"a"`) {
		t.Fatalf("the sandbox after the restart: %d %s", status, out)
	}
	if _, out := runCode(t, url2, id, tok, "x + 1"); out != "42" {
		t.Fatalf("x + 1 with the token of create after the restart: %q", out)
	}
	for _, gone := range []string{expired, orphan, empty} {
		if status, _ := send(t, "GET", url2+"/sandboxes/"+gone, "", apiKey); status != http.StatusNotFound || hasContext(m, gone) {
			t.Errorf("sandbox %s after the restart: %d, context kept %v", gone, status, hasContext(m, gone))
		}
		if _, ok := record(t, store, gone); ok {
			t.Errorf("sandbox %s: record kept", gone)
		}
		if _, err := os.Stat(filepath.Join(m.Workspaces().Dir(), "sandboxes", gone)); !os.IsNotExist(err) {
			t.Errorf("sandbox %s: files kept (%v)", gone, err)
		}
	}

	// A connect hands a new token (only hashes were kept); both open it.
	status, out := send(t, "POST", url2+"/sandboxes/"+id+"/connect", `{}`, apiKey)
	var conn struct{ EnvdAccessToken string }
	json.Unmarshal([]byte(out), &conn)
	if status != http.StatusOK || conn.EnvdAccessToken == "" || conn.EnvdAccessToken == tok {
		t.Fatalf("connect after the restart: %d %s", status, out)
	}
	if _, out := runCode(t, url2, id, conn.EnvdAccessToken, "x"); out != "41" {
		t.Fatalf("x with the token of the connect: %q", out)
	}
	if rec, _ := record(t, store, id); len(rec.TokenHashes) != 2 || rec.TokenHashes[1] != sha256.Sum256([]byte(conn.EnvdAccessToken)) {
		t.Fatalf("token hashes after the connect: %d", len(rec.TokenHashes))
	}

	if status, _ := send(t, "DELETE", url2+"/sandboxes/"+id, "", apiKey); status != http.StatusNoContent {
		t.Fatalf("kill: %d", status)
	}
	if _, ok := record(t, store, id); ok || hasContext(m, id) {
		t.Fatalf("a killed sandbox's record or context is kept")
	}
}

// gatedStore holds its first sandbox write until release is closed.
type gatedStore struct {
	*state.Memory
	puts             atomic.Int32
	entered, release chan struct{}
}

func (s *gatedStore) PutSandbox(ctx context.Context, sb state.Sandbox) error {
	if s.puts.Add(1) == 1 {
		close(s.entered)
		<-s.release
	}
	return s.Memory.PutSandbox(ctx, sb)
}

// TestSaveKeepsTheLastChange: a change saved while the write of an
// earlier one is under way is what the store holds once both returned,
// and writes under way when the sandbox is killed do not bring its
// record back.
func TestSaveKeepsTheLastChange(t *testing.T) {
	store := &gatedStore{Memory: state.NewMemory(), entered: make(chan struct{}), release: make(chan struct{})}
	m := sessions.New(sessions.Config{Store: store}, kernelspecs.Load(nil), &local.Provisioner{RuntimeDir: t.TempDir()}, nil)
	defer m.Close(context.Background())
	h := New(Config{}, m)
	sb := &sandbox{id: "kg" + strings.Repeat("1", 2*idBytes)}
	ws, err := m.Workspaces().Create("sandboxes/"+sb.id, nil)
	if err != nil {
		t.Fatal(err)
	}
	sb.ws = ws
	h.sandboxes[sb.id] = sb
	change := func(life time.Duration) chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			h.mu.Lock()
			h.setLifeLocked(sb, life)
			h.mu.Unlock()
			h.save(sb)
		}()
		return done
	}
	firstDone := change(time.Minute)
	<-store.entered // the first write is under way
	secondDone := change(time.Hour)
	// The second save has been asked for (or, if it does not wait for
	// the first write, has written).
	if !pollFor(10*time.Second, func() bool {
		select {
		case <-secondDone:
			return true
		default:
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		return sb.rec.changes == 2
	}) {
		t.Fatal("the second save neither wrote nor waited")
	}
	close(store.release)
	<-firstDone
	<-secondDone
	h.mu.Lock()
	last := sb.end
	h.mu.Unlock()
	if rec, ok := record(t, store, sb.id); !ok || !rec.Ends.Equal(last) || time.Until(last) < 50*time.Minute {
		t.Fatalf("stored end %v, want the last change %v, an hour away", rec.Ends, last)
	}

	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.mu.Lock()
			h.setLifeLocked(sb, time.Hour+time.Duration(i)*time.Second)
			h.mu.Unlock()
			h.save(sb)
		}()
	}
	h.kill(sb.id)
	wg.Wait()
	if rec, ok := record(t, store, sb.id); ok {
		t.Fatalf("a record written after the kill: %+v", rec)
	}
}

// pollFor calls ok until it holds or d has passed.
func pollFor(d time.Duration, ok func() bool) bool {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(d)
	for !ok() {
		select {
		case <-tick.C:
		case <-deadline:
			return false
		}
	}
	return true
}

func TestSandboxOf(t *testing.T) {
	id := "kg" + strings.Repeat("ab", idBytes)
	for in, want := range map[string]string{
		contextPrefix(id) + "python": id, contextPrefix(id) + "0123abcd": id,
		"e2b-kg12-python": "", "agent": "", "e2b-" + id: "", fmt.Sprintf("e2b-%sX-python", id): "",
	} {
		got, ok := sandboxOf(in)
		if got != want && ok || ok != (want != "") {
			t.Errorf("sandboxOf(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

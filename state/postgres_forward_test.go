package state

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"kernelgate/internal/pgtest"
)

// TestPostgresRecordForwardedRun: the record a replica writes for a run
// it forwards takes its context's kernel and language; it never replaces
// a record the owner wrote first (the owner's write came while the
// forwarding replica's was on its way); a context without a record is
// ErrNoSuchContext; the record is dropped as the owner's refusal wants.
func TestPostgresRecordForwardedRun(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("forwardedruns")
	ctx := context.Background()
	p := openPG(t, url, PostgresOptions{Replica: "a"})
	defer p.Close()
	must(t, p.PutContext(ctx, Context{ID: "c1", Language: "python", KernelID: "k1", Created: time.Now()}))
	fwd := []byte(`{"context":"c1","language":"","code":"1+1","created":"2026-12-08T01:00:00Z","state":"queued","forwarded":true}`)

	must(t, p.RecordForwardedRun(ctx, "r1", "c1", fwd))
	owners := []byte(`{"context":"c1","language":"python","code":"1+1","created":"2026-12-08T01:00:00Z","state":"running","kernel":"k1","msgId":"m1"}`)
	must(t, p.CommitRun(ctx, "r2", owners))
	must(t, p.RecordForwardedRun(ctx, "r2", "c1", fwd))
	if err := p.RecordForwardedRun(ctx, "r3", "nosuch", fwd); !errors.Is(err, ErrNoSuchContext) {
		t.Fatalf("a run of a context without a record: %v, want ErrNoSuchContext", err)
	}

	runs := loadRuns(t, p)
	var r1 map[string]any
	if err := json.Unmarshal(runs["r1"], &r1); err != nil {
		t.Fatalf("r1's record %q: %v", runs["r1"], err)
	}
	if r1["kernel"] != "k1" || r1["language"] != "python" || r1["state"] != "queued" || r1["forwarded"] != true || r1["code"] != "1+1" {
		t.Errorf("the forwarded run's record is %s, want its context's kernel k1 and language python, queued, forwarded", runs["r1"])
	}
	if string(runs["r2"]) != string(owners) {
		t.Errorf("the owner's record became %s, want it kept: %s", runs["r2"], owners)
	}
	if _, ok := runs["r3"]; ok {
		t.Errorf("a run of a context without a record was recorded: %s", runs["r3"])
	}

	must(t, p.DropQueuedRun(ctx, "r1"))
	must(t, p.DropQueuedRun(ctx, "r2"))
	runs = loadRuns(t, p)
	if _, ok := runs["r1"]; ok {
		t.Errorf("the forwarded run's record outlived its drop: %s", runs["r1"])
	}
	if _, ok := runs["r2"]; !ok {
		t.Errorf("the owner's record of a run that went on was dropped")
	}
}

func loadRuns(t *testing.T, p *Postgres) map[string][]byte {
	t.Helper()
	snap, err := p.Load(context.Background())
	must(t, err)
	runs := map[string][]byte{}
	for _, r := range snap.Runs {
		runs[r.ID] = r.Data
	}
	return runs
}

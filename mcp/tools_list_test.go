package mcp

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"kernelgate/kernelspecs"
	"kernelgate/sessions"
)

var update = flag.Bool("update", false, "rewrite testdata/tools.golden.json")

// The tools a client lists: their names, titles, descriptions,
// annotations and argument schemas (names, types, required and optional,
// descriptions, enums and bounds), as testdata/tools.golden.json holds
// them. Key order aside, the JSON is compared as it is.
func TestToolsList(t *testing.T) {
	cs := inMemoryClient(t)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(res.Tools)
	if err != nil {
		t.Fatal(err)
	}
	var v any // through a map: keys sorted
	if err := json.Unmarshal(js, &v); err != nil {
		t.Fatal(err)
	}
	got, _ := json.MarshalIndent(v, "", "  ")
	const golden = "testdata/tools.golden.json"
	if *update {
		if err := os.WriteFile(golden, append(got, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if string(got)+"\n" != string(want) {
		os.WriteFile(golden+".got", append(got, '\n'), 0o644)
		t.Errorf("tools/list differs from %s (see %s.got)", golden, golden)
	}
}

// inMemoryClient is a client of a Handler over a manager that serves
// python from testdata/kernels (no kernel is started).
func inMemoryClient(t *testing.T) *sdk.ClientSession {
	t.Helper()
	mgr := sessions.New(sessions.Config{Languages: map[string]string{"python": "python3"}},
		kernelspecs.Load([]string{"testdata/kernels"}), nil, nil)
	t.Cleanup(func() { mgr.Close(context.Background()) })
	h := New(Config{Files: WorkspaceFiles(mgr, 1<<20), MaxReadBytes: 1 << 20, Version: "test"}, mgr)
	ct, st := sdk.NewInMemoryTransports()
	ss, err := h.server.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

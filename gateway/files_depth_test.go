package gateway

import (
	"fmt"
	"strings"
	"testing"

	"kernelgate/workspace"
)

// TestFilesDepthBounded: a path deeper than workspace.MaxDepth is a 400
// BAD_REQUEST that makes nothing; one at the limit is written and read;
// a recursive listing of a deeper tree a kernel made stops at the limit,
// and the deepest folder it shows lists and its file downloads.
func TestFilesDepthBounded(t *testing.T) {
	g := newGateway(t)
	b4Context(t, g, map[string]any{"id": "deep"})
	deep := func(levels int, last string) string { return strings.Repeat("a/", levels-1) + last }

	for _, levels := range []int{workspace.MaxDepth + 1, 2000} {
		status, out := g.put("deep", deep(levels, "x"), strings.NewReader("x"), nil)
		if status != 400 || decode[map[string]string](t, out)["code"] != "BAD_REQUEST" {
			t.Errorf("PUT %d levels: %d %s", levels, status, out)
		}
		if resp, body := g.get("deep", deep(levels, "x"), nil); resp.StatusCode != 400 {
			t.Errorf("GET %d levels: %d %s", levels, resp.StatusCode, body)
		}
	}
	if status, out := g.do("GET", "/api/contexts/deep/files", nil); status != 200 || strings.Contains(string(out), `"a"`) {
		t.Errorf("refused uploads made folders: %d %s", status, out)
	}
	if status, out := g.put("deep", deep(workspace.MaxDepth, "x"), strings.NewReader("deepest"), nil); status != 201 {
		t.Fatalf("PUT at the limit: %d %s", status, out)
	}
	if resp, body := g.get("deep", deep(workspace.MaxDepth, "x"), nil); resp.StatusCode != 200 || string(body) != "deepest" {
		t.Errorf("GET at the limit: %d %q", resp.StatusCode, body)
	}

	// A kernel makes a tree deeper than the limit.
	mustRun(t, g, map[string]any{"context": "deep", "code": fmt.Sprintf(`
import os
p = "/".join(["t"] + ["b"] * %d)
os.makedirs(p)
open(p + "/f.txt", "w").write("below the limit")
open("/".join(["t"] + ["b"] * %d) + "/f.txt", "w").write("at the limit")
`, workspace.MaxDepth+50, workspace.MaxDepth-2)})
	status, out := g.do("GET", "/api/contexts/deep/files?path=t&recursive=true", nil)
	if status != 200 {
		t.Fatalf("recursive listing: %d %s", status, out)
	}
	list := decode[[]fileModel](t, out)
	most, deepest := 0, ""
	for _, f := range list {
		if n := strings.Count(f.Path, "/") + 1; n > most {
			most, deepest = n, f.Path
		}
	}
	if most != workspace.MaxDepth {
		t.Errorf("the recursive listing went %d levels deep (%d entries), want %d", most, len(list), workspace.MaxDepth)
	}
	if status, out := g.do("GET", "/api/contexts/deep/files?path="+deepest[:strings.LastIndexByte(deepest, '/')], nil); status != 200 {
		t.Errorf("listing the deepest folder listed: %d %s", status, out)
	}
	atLimit := strings.Repeat("t/", 1) + strings.Repeat("b/", workspace.MaxDepth-2) + "f.txt"
	if resp, body := g.get("deep", atLimit, nil); resp.StatusCode != 200 || string(body) != "at the limit" {
		t.Errorf("GET of the kernel's file at the limit: %d %q", resp.StatusCode, body)
	}
}

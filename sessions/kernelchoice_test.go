package sessions

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kernelgate/jupyter"
	"kernelgate/kernelspecs"
)

// specsOf writes kernelspecs name → language into a folder and loads them.
func specsOf(t *testing.T, langs map[string]string) *kernelspecs.Catalog {
	t.Helper()
	root := t.TempDir()
	for name, lang := range langs {
		dir := filepath.Join(root, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		js := `{"argv": ["fake-kernel", "{connection_file}"], "display_name": "` + name + `", "language": "` + lang + `"}`
		if err := os.WriteFile(filepath.Join(dir, "kernel.json"), []byte(js), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return kernelspecs.Load([]string{root})
}

// TestChooseKernel: a request's language and kernelspec resolve to the
// kernelspec, the language its runs report and its shared context.
func TestChooseKernel(t *testing.T) {
	specs := specsOf(t, map[string]string{"py": "python", "deno": "typescript", "ir": "R", "octave": "Octave", "xpy": "python"})
	m := New(Config{DefaultKernel: "py", Languages: map[string]string{"python": "py", "javascript": "deno", "typescript": "deno", "r": "ir"}}, specs, nil, nil)
	t.Cleanup(func() { m.Close(context.Background()) })
	for _, tc := range []struct {
		language, kernelspec string
		spec, lang, shared   string
		err                  error
		msg                  string
	}{
		{spec: "py", lang: "python", shared: "code-python"},
		{language: "r", spec: "ir", lang: "r", shared: "code-r"},
		{kernelspec: "ir", spec: "ir", lang: "r", shared: "code-r"},
		{kernelspec: "deno", spec: "deno", lang: "typescript", shared: "code-typescript"},
		{language: "javascript", kernelspec: "deno", spec: "deno", lang: "javascript", shared: "code-javascript"},
		{kernelspec: "octave", spec: "octave", lang: "octave", shared: "kernelspec-octave"},
		{language: "octave", kernelspec: "octave", spec: "octave", lang: "octave", shared: "kernelspec-octave"},
		{kernelspec: "xpy", spec: "xpy", lang: "python", shared: "kernelspec-xpy"},
		{language: "python", kernelspec: "xpy", spec: "xpy", lang: "python", shared: "kernelspec-xpy"},
		{language: "octave", err: ErrInvalidLanguage, msg: "available: javascript, python, r, typescript"},
		{kernelspec: "nope", err: ErrInvalidLanguage, msg: "installed: deno, ir, octave, py, xpy"},
		{language: "python", kernelspec: "ir", err: ErrBadRequest, msg: "kernelspec ir runs r, not python"},
	} {
		got, err := m.catalog.chooseKernel(tc.language, tc.kernelspec)
		if tc.err != nil {
			if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("%q %q: error %v, want %v with %q", tc.language, tc.kernelspec, err, tc.err, tc.msg)
			}
			continue
		}
		if err != nil || got.spec.Name != tc.spec || got.language != tc.lang || got.shared != tc.shared {
			t.Errorf("%q %q: %s %s %s %v, want %s %s %s", tc.language, tc.kernelspec, got.spec.Name, got.language, got.shared, err, tc.spec, tc.lang, tc.shared)
		}
	}
}

// TestRestoreKeepsKernelspec: a context made by kernelspec name comes back
// after a restart of the gateway on that kernelspec, not its language's.
func TestRestoreKeepsKernelspec(t *testing.T) {
	dir := t.TempDir()
	store := openStore(t, dir)
	f := &fakeKernels{}
	specs := specsOf(t, map[string]string{"fake": "python", "other": "python"})
	cfg := Config{DefaultKernel: "fake", Languages: map[string]string{"python": "fake"}, Store: store}
	m1 := New(cfg, specs, nil, nil)
	m1.start = f.start
	ctx := context.Background()
	c1, err := m1.CreateContext(ctx, ContextRequest{ID: "by-name", Kernelspec: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if cm := c1.Model(); cm.Kernelspec != "other" || cm.Language != "python" {
		t.Fatalf("context %+v", cm)
	}
	m1.Detach(ctx)
	store.Close()

	store = openStore(t, dir)
	defer store.Close()
	cfg.Store, cfg.PoolSize = store, 0
	m2 := newFakeManagerWith(t, cfg, f, specs)
	m2.reconnect = func(context.Context, jupyter.ProvisionerInfo, jupyter.Config) (connecting, error) {
		return nil, jupyter.ErrNotAdoptable
	}
	if _, err := m2.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	c2, err := m2.Context("by-name")
	if err != nil {
		t.Fatal(err)
	}
	if cm := c2.Model(); cm.Kernelspec != "other" || cm.Language != "python" {
		t.Errorf("context after the restore: %+v", cm)
	}
}

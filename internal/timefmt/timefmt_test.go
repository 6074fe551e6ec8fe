package timefmt

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestFormat(t *testing.T) {
	paris := time.FixedZone("CET", 3600)
	for _, c := range []struct {
		in   time.Time
		want string
	}{
		{time.Date(2026, 1, 2, 4, 4, 5, 123456789, paris), "2026-01-02T03:04:05.123456Z"},
		{time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), "2026-01-02T03:04:05.000000Z"},
	} {
		got := Format(c.in)
		if got != c.want {
			t.Errorf("Format(%v) = %s, want %s", c.in, got, c.want)
		}
		if back, err := Parse(got); err != nil || !back.Equal(c.in.Truncate(time.Microsecond)) {
			t.Errorf("Parse(%s) = %v, %v", got, back, err)
		}
	}
}

// TestOneFormat keeps every time layout of the module in this package.
func TestOneFormat(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	layout := regexp.MustCompile(`"2006-01-02T15:04:05|time\.RFC3339`)
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || filepath.Dir(path) == filepath.Join(root, "internal", "timefmt") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if loc := layout.FindIndex(b); loc != nil {
			rel, _ := filepath.Rel(root, path)
			t.Errorf("%s writes times in a layout of its own (%s): use timefmt.Format", rel, b[loc[0]:loc[1]])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

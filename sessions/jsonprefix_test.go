package sessions

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestStreamPrefix(t *testing.T) {
	texts := []string{"", "hello\n", "tab\tquote\" back\\ slash/ é ☃ 😀 \u0001", strings.Repeat("x", 1000)}
	for _, text := range texts {
		for _, name := range []string{"stdout", "stderr"} {
			raw, _ := json.Marshal(map[string]string{"name": name, "text": text})
			for _, max := range []int{0, 1, 5, 10000} {
				gotName, prefix, total, ok := streamPrefix(raw, max)
				if !ok || gotName != name || total != len(text) {
					t.Fatalf("%q max %d: %q %d %v", text, max, gotName, total, ok)
				}
				if !strings.HasPrefix(text, prefix) || len(prefix) > max || (max >= len(text) && prefix != text) {
					t.Fatalf("%q max %d: prefix %q", text, max, prefix)
				}
			}
		}
	}
	// Python's json escapes non-ASCII; spaces after colons.
	gotName, prefix, total, ok := streamPrefix([]byte(`{"name": "stdout", "text": "\u00e9\ud83d\ude00!"}`), 100)
	if !ok || gotName != "stdout" || prefix != "é😀!" || total != len("é😀!") {
		t.Fatalf("%q %q %d %v", gotName, prefix, total, ok)
	}
	for _, bad := range []string{`{"name":"stdout"}`, `{"name":"x","text":"a"}`, `{"name":"stdout","text":"unterminated`, `{"name":"stdout","text":"\q"}`} {
		if _, _, _, ok := streamPrefix([]byte(bad), 10); ok {
			t.Errorf("%s accepted", bad)
		}
	}
}

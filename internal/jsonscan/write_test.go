package jsonscan

import (
	"encoding/json"
	"strings"
	"testing"
)

var stringCases = []string{
	"", "plain", "line\n", "tab\tquote\"back\\slash", "\b\f\r\x00\x01\x1f\x7f",
	"<script>&</script>", "é漢字🙂", "\u2028\u2029", "bad\xffutf8\xc3", "\xe2\x80", strings.Repeat("y", 1<<16) + "\n",
}

func checkString(t *testing.T, s string) {
	want, _ := json.Marshal(s)
	got := AppendString([]byte("x"), s)
	if string(got) != "x"+string(want) {
		t.Fatalf("AppendString(%q) = %s, encoding/json writes %s", s, got[1:], want)
	}
	if n := StringLen(s); n != len(want) {
		t.Fatalf("StringLen(%q) = %d, the JSON is %d bytes", s, n, len(want))
	}
}

func TestAppendStringIsEncodingJSONs(t *testing.T) {
	for _, s := range stringCases {
		checkString(t, s)
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range stringCases {
		f.Add(s)
	}
	f.Fuzz(checkString)
}

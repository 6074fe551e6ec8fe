package mcp

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"testing/iotest"
)

// What a text file takes from the read budget is its answer's length: the
// text as a JSON string (or its base64, which the answer falls back to,
// when longer), not more. Characters from U+2000 to U+2FFF (dashes,
// quotes, arrows, box drawing) are three bytes in the file and three in
// the JSON; only U+2028 and U+2029 become six (\u2028). The file may come
// in pieces of any size.
func TestAnswerBoundIsTheAnswersLength(t *testing.T) {
	for _, s := range []string{
		strings.Repeat("─", 1000),
		strings.Repeat("— “quoted” → ", 300),
		strings.Repeat("a\u2028b\u2029", 200),
		strings.Repeat("┌─┐│ │└─┘\n", 100),
		"plain text",
	} {
		js, _ := json.Marshal(s)
		want := max(int64(len(js)-2), int64(base64.StdEncoding.EncodedLen(len(s))))
		got, err := answerBound(strings.NewReader(s), "a.txt", int64(len(s)))
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%.20q…: answerBound %d, want %d (the answer's length)", s, got, want)
		}
		got, err = answerBound(iotest.OneByteReader(strings.NewReader(s)), "a.txt", int64(len(s)))
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("byte by byte %.20q…: answerBound %d, want %d", s, got, want)
		}
	}
}

package e2b

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"kernelgate/runs"
	"kernelgate/workspace"
)

func TestResultLine(t *testing.T) {
	r := &runs.Result{IsMainResult: true, Data: map[string]json.RawMessage{
		"text/plain":                  json.RawMessage(`"'hello'"`),
		"text/html":                   json.RawMessage(`"<b>hi</b>"`),
		"image/png":                   json.RawMessage(`"iVBORw0KGgo="`),
		"application/json":            json.RawMessage(`{"a":1}`),
		"application/vnd.custom+json": json.RawMessage(`{"x":true}`),
	}}
	js, _ := json.Marshal(resultLine(r))
	var got map[string]any
	json.Unmarshal(js, &got)
	want := map[string]any{"type": "result", "is_main_result": true, "text": "hello", "html": "<b>hi</b>", "png": "iVBORw0KGgo=",
		"json": map[string]any{"a": float64(1)}, "extra": map[string]any{"application/vnd.custom+json": map[string]any{"x": true}}}
	if g, w := mustJSON(got), mustJSON(want); g != w {
		t.Fatalf("result line\n got %s\nwant %s", g, w)
	}
}

func mustJSON(v any) string { js, _ := json.Marshal(v); return string(js) }

func TestTranslateEnd(t *testing.T) {
	var buf bytes.Buffer
	end := runs.Event{Type: "end", JSON: []byte(`{"type":"end","seq":9,"executionCount":4,"process":{"reason":"lost"},"truncated":false}`)}
	if err := translate(&buf, end, false); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 || lines[0] != `{"type":"number_of_executions","execution_count":4}` ||
		!strings.Contains(lines[1], `"name":"ContextRestarting"`) || lines[2] != `{"type":"end_of_execution"}` {
		t.Fatalf("end of a lost run = %q", lines)
	}
	buf.Reset()
	errEv := runs.Event{Type: "error", JSON: []byte(`{"type":"error","seq":3,"name":"ValueError","value":"bad","message":"bad","traceback":["a","b"]}`)}
	translate(&buf, errEv, true)
	if got := strings.TrimSpace(buf.String()); got != `{"type":"error","name":"ValueError","value":"bad","traceback":"a\nb"}` {
		t.Fatalf("error line = %s", got)
	}
}

func TestRelPath(t *testing.T) {
	for in, want := range map[string]string{"/home/user": "", "/home/user/": "", "/home/user/a/b.txt": "a/b.txt", "a.txt": "a.txt", "": ""} {
		if got, err := relPath(in); err != nil || got != want {
			t.Errorf("relPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"/etc/passwd", "/home/username/x", "../x", "/home/user/../x", "a/../../x"} {
		if _, err := relPath(in); !errors.Is(err, workspace.ErrBadPath) {
			t.Errorf("relPath(%q) = %v, want ErrBadPath", in, err)
		}
	}
}

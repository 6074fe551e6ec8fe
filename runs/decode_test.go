package runs

import (
	"encoding/json"
	"reflect"
	"testing"
)

// contents holds kernel message contents as ipykernel and Deno send
// them, and the odd ones a fast reader must leave to encoding/json.
var contents = []string{
	`{"data":{"text/plain":"2"},"metadata":{},"execution_count":3}`,
	`{"data":{"text/plain":"\u001b[33m2\u001b[39m"},"metadata":{},"execution_count":1}`,
	`{"data":{"text/plain":"<Figure>","image/png":"iVBORw0KGgo=\n"},"metadata":{"image/png":{"width":640,"height":480}},"transient":{}}`,
	`{"data":{"text/html":"<b>x</b>"},"metadata":{},"transient":{"display_id":"d-1"}}`,
	`{"data":null,"metadata":null,"transient":null,"execution_count":null}`,
	`{"status":"ok","execution_count":7,"user_expressions":{},"payload":[]}`,
	`{"status":"error","execution_count":2,"ename":"ValueError","evalue":"bad","traceback":["a","b"]}`,
	`{"status":"aborted"}`,
	`{"code":"1+1","execution_count":4}`,
	`{}`, `{"execution_count":1.0}`, `{"execution_count":99999999999999999999}`, `{"execution_count":"1"}`,
	`{"data":{"a":1},"data":{"b":2}}`, `{"transient":{"display_id":"a"},"transient":{}}`,
	`{"Data":{"a":1}}`, `{"data":{"te\u0078t/plain":"2"}}`, `{"transient":{"display_id":5}}`,
	`{"transient":{"Display_ID":"x"}}`, `{"data":[1]}`, `{"status":"o\u006b"}`, `{"Status":"ok"}`,
	`{"execution_count":1,"execution_count":null}`, `{"status":5}`, `[]`, `null`, `{"data":{}`,
}

// checkReaders compares each fast reader with encoding/json on raw.
func checkReaders(t *testing.T, raw []byte) {
	t.Helper()
	var got displayContent
	if readDisplay(raw, &got) {
		var want displayContent
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatalf("readDisplay took %s, which encoding/json rejects: %v", raw, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("readDisplay read %s as %+v, encoding/json as %+v", raw, got, want)
		}
	} else if !reflect.DeepEqual(got, displayContent{}) {
		t.Fatalf("readDisplay gave up on %s leaving %+v", raw, got)
	}
	if n, ok := readInputCount(raw); ok {
		var want struct {
			ExecutionCount *int `json:"execution_count"`
		}
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatalf("readInputCount took %s, which encoding/json rejects: %v", raw, err)
		}
		if !reflect.DeepEqual(n, want.ExecutionCount) {
			t.Fatalf("readInputCount read %s as %v, encoding/json as %v", raw, n, want.ExecutionCount)
		}
	}
	if status, n, ok := readReply(raw); ok {
		var want struct {
			Status         string `json:"status"`
			ExecutionCount *int   `json:"execution_count"`
			errorContent
		}
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatalf("readReply took %s, which encoding/json rejects: %v", raw, err)
		}
		if status != want.Status || !reflect.DeepEqual(n, want.ExecutionCount) || !reflect.DeepEqual(want.errorContent, errorContent{}) {
			t.Fatalf("readReply read %s as %q %v, encoding/json as %+v", raw, status, n, want)
		}
	}
}

func TestFastReadersMatchEncodingJSON(t *testing.T) {
	for _, s := range contents {
		checkReaders(t, []byte(s))
	}
	// What the kernels send is read without encoding/json.
	for _, s := range contents[:4] {
		if !readDisplay([]byte(s), new(displayContent)) {
			t.Errorf("readDisplay gave up on %s", s)
		}
	}
	if _, _, ok := readReply([]byte(contents[5])); !ok {
		t.Errorf("readReply gave up on %s", contents[5])
	}
	if n, ok := readInputCount([]byte(contents[8])); !ok || n == nil || *n != 4 {
		t.Errorf("readInputCount(%s) = %v, %v", contents[8], n, ok)
	}
}

func FuzzFastReaders(f *testing.F) {
	for _, s := range contents {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkReaders(t, raw)
	})
}

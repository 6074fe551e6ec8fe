package sessions

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestEventJSON(t *testing.T) {
	two := 2
	for _, c := range []struct {
		typ     string
		seq     int
		payload any
		want    string
	}{
		{"keepalive", 5, nil, `{"type":"keepalive","seq":5}`},
		{"start", 1, struct{}{}, `{"type":"start","seq":1}`},
		{"stdout", 12, map[string]string{"text": "hi\n"}, `{"type":"stdout","seq":12,"text":"hi\n"}`},
		{"stdout", 13, textEvent{Text: "hi\n"}, `{"type":"stdout","seq":13,"text":"hi\n"}`},
		{"stderr", 14, textEvent{Text: "<b>\"é\u2028\x01"}, `{"type":"stderr","seq":14,"text":"<b>\"é\u2028\u0001"}`},
		{"stdout", 15, textEvent{}, `{"type":"stdout","seq":15,"text":""}`},
		{"end", 3, endEvent{&two, ProcessState{ExitCode: &two, Reason: Errored}, true},
			`{"type":"end","seq":3,"executionCount":2,"process":{"exitCode":2,"reason":"error"},"truncated":true}`},
		{"end", 4, endEvent{nil, ProcessState{Reason: TimedOut}, false},
			`{"type":"end","seq":4,"executionCount":null,"process":{"reason":"timed_out"},"truncated":false}`},
	} {
		js, err := eventJSON(c.typ, c.seq, c.payload)
		if err != nil {
			t.Fatal(err)
		}
		var got, want any
		if err := json.Unmarshal(js, &got); err != nil {
			t.Fatalf("%s: %q is not JSON: %v", c.typ, js, err)
		}
		json.Unmarshal([]byte(c.want), &want)
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		if string(g) != string(w) {
			t.Errorf("eventJSON(%q, %d, %v) = %s, want %s", c.typ, c.seq, c.payload, js, c.want)
		}
	}
}

// TestExecutionJSONIsEncodingJSONs: the Execution's JSON is json.Marshal's,
// byte for byte, whatever its members hold.
func TestExecutionJSONIsEncodingJSONs(t *testing.T) {
	if n := reflect.TypeFor[Execution]().NumField(); n != 9 {
		t.Fatalf("Execution has %d fields; marshalExecution writes 9: write the new ones", n)
	}
	two := 2
	full := Execution{
		ID: "run-1", Context: "ctx <a>", Language: "python",
		Logs:           Logs{Stdout: []string{"1\n", "\"quoted\" \\ \t\x00\u2029", "bad\xff"}, Stderr: []string{"warn & </script>\n"}},
		Results:        []*Result{{Data: map[string]json.RawMessage{"text/plain": json.RawMessage(`"4"`)}, IsMainResult: true}, nil, {Data: map[string]json.RawMessage{"text/html": json.RawMessage(`"<b>x</b>"`), "application/json": json.RawMessage(`{"a": [1, 2]}`)}, Metadata: map[string]json.RawMessage{}, DisplayID: "d"}},
		Error:          &ExecError{Name: "ValueError", Value: "bad <value>", Traceback: []string{"line 1", "\x1b[31mred"}},
		ExecutionCount: &two,
		Process:        ProcessState{ExitCode: &two, Reason: Errored, Message: "restarted"},
		Truncated:      true,
	}
	for name, e := range map[string]Execution{"empty": {}, "empty lists": {Logs: Logs{Stdout: []string{}, Stderr: []string{}}, Results: []*Result{}}, "full": full} {
		want, err := json.Marshal(&e)
		if err != nil {
			t.Fatal(err)
		}
		if got := marshalExecution(&e); string(got) != string(want) {
			t.Errorf("%s: marshalExecution wrote\n%s\njson.Marshal writes\n%s", name, got, want)
		}
	}
}

// A stdout event's size is counted without writing its JSON: output of
// megabytes is not encoded once more to be measured.
func TestTextEventSizeWritesNothing(t *testing.T) {
	var p any = textEvent{Text: string(make([]byte, 1<<20))}
	if a := testing.AllocsPerRun(10, func() { eventSize("stdout", p) }); a != 0 {
		t.Errorf("eventSize of a text event allocated %v times", a)
	}
}

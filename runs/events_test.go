package runs

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
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

// The start and end events every run has are sized without writing
// their JSON, and their size covers it.
func TestStartAndEndEventSizes(t *testing.T) {
	two := 2
	for typ, p := range map[string]any{
		"start": map[string]string{"run": "0190-<id>", "context": "ctx \"a\"", "language": "python"},
		"end":   endEvent{ExecutionCount: &two, Process: ProcessState{ExitCode: &two, Reason: TimedOut, Message: "the run took <longer> than its timeout"}, Truncated: true},
	} {
		js, err := eventJSON(typ, 12345, p)
		if err != nil {
			t.Fatal(err)
		}
		if n := eventSize(typ, p); n < len(js) {
			t.Errorf("eventSize(%s) = %d, below its JSON's %d bytes: %s", typ, n, len(js), js)
		}
		if a := testing.AllocsPerRun(10, func() { eventSize(typ, p) }); a != 0 {
			t.Errorf("eventSize of the %s event allocated %v times", typ, a)
		}
	}
}

// TestRunRecordJSONIsEncodingJSONs: a run record's JSON is json.Marshal's,
// byte for byte, with the Execution last, whatever its members hold.
func TestRunRecordJSONIsEncodingJSONs(t *testing.T) {
	if n := reflect.TypeFor[Record]().NumField(); n != 14 {
		t.Fatalf("Record has %d fields; marshalRunRecord writes 14: write the new ones", n)
	}
	at := time.Date(2026, 12, 6, 23, 59, 1, 123456789, time.UTC)
	full := Record{Context: "ctx <a>", Language: "python", Code: "print(\"&\")\n\x00\u2028bad\xff", Stdin: true,
		Created: at, Deadline: at.Add(time.Minute).In(time.FixedZone("x", 3600)), State: RunDone,
		Kernel: "k-1", MsgID: "m-1", Kind: RecordCommand, Forwarded: true, Finished: at.Add(2 * time.Second), Failure: "the kernel <died>"}
	exec := []byte(`{"id":"r","logs":{"stdout":["2\n"]}}`)
	for name, c := range map[string]struct {
		rec  Record
		exec []byte
	}{"empty": {}, "queued": {rec: Record{Context: "c", Language: "deno", Code: "1+1", Created: at, State: RunQueued}}, "full": {full, exec}} {
		// encoding/json writes the record, and the Execution is put last.
		want, err := json.Marshal(c.rec)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.exec) > 0 {
			want = append(append(append(want[:len(want)-1], `,"execution":`...), c.exec...), '}')
		}
		if got := marshalRunRecord(c.rec, c.exec); string(got) != string(want) {
			t.Errorf("%s: marshalRunRecord wrote\n%s\njson.Marshal writes\n%s", name, got, want)
		}
	}
	if got := marshalRunRecord(Record{Created: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, nil); got != nil {
		t.Errorf("a record json.Marshal cannot write was written: %s", got)
	}
}

// The start and end events are written by hand as json.Marshal writes
// them, byte for byte.
func TestStartAndEndEventsAreEncodingJSONs(t *testing.T) {
	if n := reflect.TypeFor[ProcessState]().NumField(); n != 3 {
		t.Fatalf("ProcessState has %d fields; appendEndEvent writes 3: write the new ones", n)
	}
	two, zero := 2, 0
	for _, p := range []any{
		map[string]string{}, map[string]string{"run": "r-1", "context": "<ctx> & \"a\"", "language": "python", "z": "\xff\u2029"},
		endEvent{}, endEvent{ExecutionCount: &two, Truncated: true},
		endEvent{ExecutionCount: &zero, Process: ProcessState{ExitCode: &zero}},
		endEvent{Process: ProcessState{Message: "restarted <now>"}},
		endEvent{ExecutionCount: &two, Process: ProcessState{ExitCode: &two, Reason: Errored, Message: "the kernel died"}},
		endEvent{Process: ProcessState{Reason: TimedOut}},
	} {
		want, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		var got []byte
		switch p := p.(type) {
		case map[string]string:
			got = appendStringMap(nil, p)
		case endEvent:
			got = appendEndEvent(nil, p)
		}
		if string(got) != string(want) {
			t.Errorf("wrote\n%s\njson.Marshal writes\n%s", got, want)
		}
	}
}

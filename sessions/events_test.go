package sessions

import (
	"encoding/json"
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

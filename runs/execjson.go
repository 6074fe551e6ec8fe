package runs

import (
	"encoding/json"
	"slices"
	"strconv"

	"kernelgate/internal/jsonscan"
)

// marshalExecution writes e as json.Marshal does, byte for byte, in one
// allocation of the JSON's size. json.Marshal builds a run's megabytes
// of output in a buffer that doubles as it fills and then copies it out,
// and keeps that buffer pooled after: three times the output, at the
// moment a run with the most output ends.
func marshalExecution(e *Execution) []byte {
	// The small members, as encoding/json writes them.
	errJSON, _ := json.Marshal(e.Error)
	procJSON, _ := json.Marshal(e.Process)
	results := make([][]byte, len(e.Results))
	n := 128 + jsonscan.StringLen(e.ID) + jsonscan.StringLen(e.Context) + jsonscan.StringLen(e.Language) +
		logsLen(e.Logs.Stdout) + logsLen(e.Logs.Stderr) + len(errJSON) + len(procJSON)
	for i, r := range e.Results {
		if r == nil {
			results[i] = []byte("null")
		} else {
			results[i], _ = r.MarshalJSON()
		}
		n += len(results[i]) + 1
	}

	b := make([]byte, 0, n)
	b = append(b, `{"id":`...)
	b = jsonscan.AppendString(b, e.ID)
	b = append(b, `,"context":`...)
	b = jsonscan.AppendString(b, e.Context)
	b = append(b, `,"language":`...)
	b = jsonscan.AppendString(b, e.Language)
	b = append(b, `,"logs":{"stdout":`...)
	b = appendLogs(b, e.Logs.Stdout)
	b = append(b, `,"stderr":`...)
	b = appendLogs(b, e.Logs.Stderr)
	b = append(b, `},"results":`...)
	if e.Results == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, r := range results {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, r...)
		}
		b = append(b, ']')
	}
	b = append(b, `,"error":`...)
	b = append(b, errJSON...)
	b = append(b, `,"executionCount":`...)
	if e.ExecutionCount == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, int64(*e.ExecutionCount), 10)
	}
	b = append(b, `,"process":`...)
	b = append(b, procJSON...)
	b = append(b, `,"truncated":`...)
	b = strconv.AppendBool(b, e.Truncated)
	return append(b, '}')
}

// logsLen is the length of appendLogs's JSON of texts.
func logsLen(texts []string) int {
	n := 4 // null, or [] and its commas
	for _, s := range texts {
		n += jsonscan.StringLen(s) + 1
	}
	return n
}

// appendLogs appends texts as a JSON array of strings (nil: null).
func appendLogs(b []byte, texts []string) []byte {
	if texts == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, s := range texts {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonscan.AppendString(b, s)
	}
	return append(b, ']')
}

// textEvent is the payload of a stdout or stderr event.
type textEvent struct {
	Text string `json:"text"`
}

// appendTextEvent is eventJSON of a textEvent, in one allocation.
func appendTextEvent(typ string, seq int, p textEvent) []byte {
	out := make([]byte, 0, 48+len(typ)+jsonscan.StringLen(p.Text))
	out = append(out, `{"type":"`...)
	out = append(out, typ...)
	out = append(out, `","seq":`...)
	out = strconv.AppendInt(out, int64(seq), 10)
	out = append(out, `,"text":`...)
	out = jsonscan.AppendString(out, p.Text)
	return append(out, '}')
}

// appendStringMap appends m as json.Marshal writes it: keys in order.
func appendStringMap(b []byte, m map[string]string) []byte {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonscan.AppendString(b, k)
		b = append(b, ':')
		b = jsonscan.AppendString(b, m[k])
	}
	return append(b, '}')
}

// appendEndEvent appends e as json.Marshal writes it.
func appendEndEvent(b []byte, e endEvent) []byte {
	b = append(b, `{"executionCount":`...)
	b = appendCount(b, e.ExecutionCount)
	b = append(b, `,"process":{`...)
	sep := ""
	if p := e.Process; p.ExitCode != nil {
		b = append(b, `"exitCode":`...)
		b = strconv.AppendInt(b, int64(*p.ExitCode), 10)
		sep = ","
	}
	if p := e.Process; p.Reason != "" {
		b = append(b, sep+`"reason":`...)
		b = jsonscan.AppendString(b, string(p.Reason))
		sep = ","
	}
	if p := e.Process; p.Message != "" {
		b = append(b, sep+`"message":`...)
		b = jsonscan.AppendString(b, p.Message)
	}
	b = append(b, `},"truncated":`...)
	b = strconv.AppendBool(b, e.Truncated)
	return append(b, '}')
}

// appendCount appends an execution count: null for none.
func appendCount(b []byte, n *int) []byte {
	if n == nil {
		return append(b, "null"...)
	}
	return strconv.AppendInt(b, int64(*n), 10)
}

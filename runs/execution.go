package runs

import (
	"encoding/json"
	"regexp"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"kernelgate/internal/jsonscan"
	"kernelgate/jupyter"
)

// Execution is the outcome of a run, as POST /api/execute returns it.
type Execution struct {
	ID             string       `json:"id"`
	Context        string       `json:"context"`
	Language       string       `json:"language"`
	Logs           Logs         `json:"logs"`
	Results        []*Result    `json:"results"`
	Error          *ExecError   `json:"error"`
	ExecutionCount *int         `json:"executionCount"`
	Process        ProcessState `json:"process"`
	Truncated      bool         `json:"truncated"`
}

// Logs are the texts of the run's stream messages, in order.
type Logs struct {
	Stdout []string `json:"stdout"`
	Stderr []string `json:"stderr"`
}

// ProcessState says how a run ended; empty while it has not. Message
// says why a run was lost (the kernel ran out of memory, was restarted).
type ProcessState struct {
	ExitCode *int   `json:"exitCode,omitempty"`
	Reason   Reason `json:"reason,omitempty"`
	Message  string `json:"message,omitempty"`
}

// Reason is how a run ended.
type Reason string

// The ends of a run.
const (
	Completed   Reason = "completed"
	Errored     Reason = "error"
	Interrupted Reason = "interrupted"
	TimedOut    Reason = "timed_out"
	Lost        Reason = "lost"
	// Killed is how a command ended by Kill ends.
	Killed Reason = "killed"
)

// ExecError is the exception the code raised.
type ExecError struct {
	Name      string   `json:"name"`
	Value     string   `json:"value"`
	Message   string   `json:"message"`
	Traceback []string `json:"traceback"`
}

// Result is one display_data or execute_result: the whole MIME bundle as
// the kernel sent it, with short mirrors of the common types.
type Result struct {
	Data         map[string]json.RawMessage `json:"data"`
	Metadata     map[string]json.RawMessage `json:"metadata"`
	IsMainResult bool                       `json:"isMainResult"`
	DisplayID    string                     `json:"displayId,omitempty"`
	Text         string                     `json:"text,omitempty"`
	HTML         string                     `json:"html,omitempty"`
	Markdown     string                     `json:"markdown,omitempty"`
	LaTeX        string                     `json:"latex,omitempty"`
	PNG          string                     `json:"png,omitempty"`
	JPEG         string                     `json:"jpeg,omitempty"`
	SVG          string                     `json:"svg,omitempty"`
	PDF          string                     `json:"pdf,omitempty"`
	JSON         json.RawMessage            `json:"json,omitempty"`
	JavaScript   string                     `json:"javascript,omitempty"`

	size int
	js   atomic.Pointer[[]byte] // the JSON, once made
}

// MarshalJSON writes the result with the short mirrors of its bundle. A
// result made by a run holds its bundle once: the mirrors are filled only
// here, and the run's result event and its Execution share the Result. It
// is not changed after it is made (an update replaces it), so its JSON is
// made once. The caller must not change what it returns.
func (r *Result) MarshalJSON() ([]byte, error) {
	if js := r.js.Load(); js != nil {
		return *js, nil
	}
	type plain Result
	c := plain{Data: r.Data, Metadata: r.Metadata, IsMainResult: r.IsMainResult, DisplayID: r.DisplayID}
	(*Result)(&c).mirror()
	js, err := json.Marshal(&c)
	if err != nil {
		return nil, err
	}
	r.js.Store(&js)
	return js, nil
}

// ansi matches terminal escape sequences (CSI and OSC).
var ansi = regexp.MustCompile(`\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]`)

// StripANSI removes terminal escape sequences from s.
func StripANSI(s string) string {
	if !strings.Contains(s, "\x1b") {
		return s
	}
	return ansi.ReplaceAllString(s, "")
}

// mimeText reads a bundle entry as text: a JSON string, or a list of
// strings (nbformat's multi-line form).
func mimeText(raw json.RawMessage) string {
	if s, ok := jsonscan.String(raw); ok {
		return s
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var lines []string
	if json.Unmarshal(raw, &lines) == nil {
		return strings.Join(lines, "")
	}
	return ""
}

// newResult builds a result from a bundle.
func newResult(data, metadata map[string]json.RawMessage, main bool, displayID string) *Result {
	if data == nil {
		data = map[string]json.RawMessage{}
	}
	if metadata == nil {
		metadata = map[string]json.RawMessage{}
	}
	r := &Result{Data: data, Metadata: metadata, IsMainResult: main, DisplayID: displayID}
	for _, raw := range r.Data {
		r.size += len(raw)
	}
	for _, raw := range r.Metadata {
		r.size += len(raw)
	}
	return r
}

// mirror fills the short fields from the bundle.
func (r *Result) mirror() {
	r.Text, r.HTML, r.Markdown, r.LaTeX, r.PNG, r.JPEG, r.SVG, r.PDF, r.JSON, r.JavaScript = "", "", "", "", "", "", "", "", nil, ""
	for mime, raw := range r.Data {
		switch mime {
		case "text/plain":
			r.Text = StripANSI(mimeText(raw))
		case "text/html":
			r.HTML = mimeText(raw)
		case "text/markdown":
			r.Markdown = mimeText(raw)
		case "text/latex":
			r.LaTeX = mimeText(raw)
		case "image/png":
			r.PNG = strings.TrimSpace(mimeText(raw))
		case "image/jpeg":
			r.JPEG = strings.TrimSpace(mimeText(raw))
		case "image/svg+xml":
			r.SVG = mimeText(raw)
		case "application/pdf":
			r.PDF = strings.TrimSpace(mimeText(raw))
		case "application/json":
			r.JSON = raw
		case "application/javascript", "text/javascript":
			r.JavaScript = mimeText(raw)
		}
	}
}

// Limits bound what one run keeps of its output.
type Limits struct {
	// LogBytes bounds the text of stdout and stderr together.
	LogBytes int
	// ResultBytes bounds the MIME bundles of the results together.
	ResultBytes int
}

// builder folds a run's kernel messages into its Execution and its
// stream events. Not safe for concurrent use: the run's lock guards it.
type builder struct {
	exec   Execution
	limits Limits
	emit   func(typ string, payload any)

	resultBytes int
	droppedData int
	// The logs keep a head and a tail within LogBytes: the head takes
	// output as it comes, up to half the limit, and is streamed live;
	// past it the newest output is kept in tail (tail[tailStart:]), within
	// the rest of the limit, and streamed when the run ends, after a
	// marker saying how many bytes were dropped from each stream.
	headBytes, tailBytes int
	headClosed           bool
	tail                 []logChunk
	tailStart            int
	droppedLog           [2]int // stdout, stderr
	clearPending         bool
	sawMain              bool
	started              bool   // the code was sent to the kernel
	replyStatus          string // of the execute_reply, once it came
	// replyError is the error an execute_reply reported, kept until the
	// run ends: the kernel's error message, richer, may come after it.
	replyError *errorContent
	// displayResults: the kernel shows its code's values with display_data
	// (IRkernel), and those without an image (a plot) are main results.
	displayResults bool
}

// logChunk is a piece of a stream's text.
type logChunk struct {
	name string
	text string
}

func streamIndex(name string) int {
	if name == "stderr" {
		return 1
	}
	return 0
}

// applyClear performs a clear_output that waited for the next output.
func (b *builder) applyClear() {
	if b.clearPending {
		b.clearPending = false
		b.clear()
	}
}

func (b *builder) clear() {
	b.exec.Logs = Logs{Stdout: []string{}, Stderr: []string{}}
	b.exec.Results = []*Result{}
	b.headBytes, b.tailBytes, b.resultBytes = 0, 0, 0
	b.headClosed, b.tail, b.tailStart = false, nil, 0
	b.droppedLog = [2]int{}
}

type streamContent struct {
	Name string `json:"name"`
	Text string `json:"text"`
}

type displayContent struct {
	Data      map[string]json.RawMessage `json:"data"`
	Metadata  map[string]json.RawMessage `json:"metadata"`
	Transient struct {
		DisplayID string `json:"display_id"`
	} `json:"transient"`
	ExecutionCount *int `json:"execution_count"`
}

type errorContent struct {
	EName     string   `json:"ename"`
	EValue    string   `json:"evalue"`
	Traceback []string `json:"traceback"`
}

// message applies one message of the run.
func (b *builder) message(ch jupyter.Channel, m *jupyter.Message) {
	switch m.Type() {
	case jupyter.StreamMsg:
		var c streamContent
		if m.DecodeContent(&c) != nil || (c.Name != "stdout" && c.Name != "stderr") {
			return
		}
		b.applyClear()
		if m.Cut == 0 {
			b.stream(c.Name, c.Text)
			return
		}
		// Cut as it was read: its head, the marker, its tail; or the
		// marker alone.
		head, tail, found := strings.Cut(c.Text, jupyter.TruncationMarker(m.Cut))
		if !found {
			tail = ""
		}
		b.stream(c.Name, head)
		b.dropLog(c.Name, int(m.Cut))
		b.stream(c.Name, tail)
	case jupyter.DisplayData, jupyter.ExecuteResult:
		if m.Cut > 0 {
			b.droppedData += int(m.Cut)
			b.noteTruncation()
		}
		if b.resultBytes+len(m.RawContent) > b.limits.ResultBytes+64<<10 {
			// Past the limit whatever it holds: drop it undecoded.
			b.applyClear()
			b.droppedData += len(m.RawContent)
			b.noteTruncation()
			if m.Type() == jupyter.ExecuteResult {
				b.sawMain = true
			}
			return
		}
		var c displayContent
		if !decodeDisplay(m, &c) {
			return
		}
		b.applyClear()
		main := m.Type() == jupyter.ExecuteResult || (b.displayResults && !hasImage(c.Data))
		if main {
			b.sawMain = true
			if c.ExecutionCount != nil {
				b.exec.ExecutionCount = c.ExecutionCount
			}
		}
		r := newResult(c.Data, c.Metadata, main, c.Transient.DisplayID)
		if b.resultBytes+r.size > b.limits.ResultBytes {
			b.droppedData += r.size
			b.noteTruncation()
			return
		}
		b.resultBytes += r.size
		b.exec.Results = append(b.exec.Results, r)
		b.emit("result", r)
	case jupyter.UpdateDisplayData:
		if m.Cut > 0 {
			b.droppedData += int(m.Cut)
			b.noteTruncation()
		}
		var c displayContent
		if !decodeDisplay(m, &c) || c.Transient.DisplayID == "" {
			return
		}
		for i, r := range b.exec.Results {
			if r.DisplayID != c.Transient.DisplayID {
				continue
			}
			next := newResult(c.Data, c.Metadata, r.IsMainResult, r.DisplayID)
			if b.resultBytes-r.size+next.size > b.limits.ResultBytes {
				b.droppedData += next.size
				b.noteTruncation()
				continue
			}
			b.resultBytes += next.size - r.size
			// Replaced, not changed: the result event still shows the
			// result as it was.
			b.exec.Results[i] = next
		}
		b.emit("display_update", map[string]any{"displayId": c.Transient.DisplayID, "data": nonNil(c.Data), "metadata": nonNil(c.Metadata)})
	case jupyter.ClearOutput:
		var c struct {
			Wait bool `json:"wait"`
		}
		m.DecodeContent(&c)
		if c.Wait {
			b.clearPending = true
		} else {
			b.clearPending = false
			b.clear()
		}
		b.emit("clear_output", map[string]bool{"wait": c.Wait})
	case jupyter.ErrorMsg:
		var c errorContent
		if m.DecodeContent(&c) != nil || b.exec.Error != nil {
			return // one error per run
		}
		b.setError(c)
	case jupyter.ExecuteInput:
		n, ok := readInputCount(m.RawContent)
		if !ok {
			var c struct {
				ExecutionCount *int `json:"execution_count"`
			}
			if m.DecodeContent(&c) != nil {
				break
			}
			n = c.ExecutionCount
		}
		if n != nil {
			b.exec.ExecutionCount = n
		}
	case jupyter.ExecuteReply:
		b.reply(m)
	case jupyter.InputRequest:
		var c struct {
			Prompt   string `json:"prompt"`
			Password bool   `json:"password"`
		}
		m.DecodeContent(&c)
		b.emit("input_request", map[string]any{"prompt": c.Prompt, "password": c.Password})
	}
}

// hasImage says whether a MIME bundle holds an image: a plot, never the
// value of the code.
func hasImage(data map[string]json.RawMessage) bool {
	for mime := range data {
		if strings.HasPrefix(mime, "image/") {
			return true
		}
	}
	return false
}

func nonNil(m map[string]json.RawMessage) map[string]json.RawMessage {
	if m == nil {
		return map[string]json.RawMessage{}
	}
	return m
}

func (b *builder) setError(c errorContent) {
	tb := make([]string, 0, len(c.Traceback))
	for _, line := range c.Traceback {
		tb = append(tb, StripANSI(line))
	}
	e := &ExecError{Name: c.EName, Value: c.EValue, Message: c.EValue, Traceback: tb}
	b.exec.Error = e
	b.emit("error", e)
}

// reply records the execute_reply: the execution count, and the error of
// kernels that report it only there (Deno's interrupted runs).
func (b *builder) reply(m *jupyter.Message) {
	var c struct {
		Status         string `json:"status"`
		ExecutionCount *int   `json:"execution_count"`
		errorContent
	}
	var ok bool
	if c.Status, c.ExecutionCount, ok = readReply(m.RawContent); !ok && m.DecodeContent(&c) != nil {
		return
	}
	b.replyStatus = c.Status
	if c.ExecutionCount != nil {
		b.exec.ExecutionCount = c.ExecutionCount
	}
	switch c.Status {
	case "aborted":
		b.replyError = &errorContent{EName: "ExecutionAborted", EValue: "the kernel aborted this run because a request before it failed; run it again"}
	case "error":
		name := c.EName
		if name == "" {
			name = "Error"
		}
		b.replyError = &errorContent{EName: name, EValue: c.EValue, Traceback: c.Traceback}
	}
}

// stream adds text to a log: to the head while it has room, else to the
// tail.
func (b *builder) stream(name, text string) {
	if text == "" {
		return
	}
	if !b.headClosed {
		room := b.limits.LogBytes/2 - b.headBytes
		if len(text) <= room {
			b.appendHead(name, text)
			return
		}
		if k := runeStart(text, max(room, 0)); k > 0 {
			b.appendHead(name, strings.Clone(text[:k])) // not the whole message
			text = text[k:]
		}
		b.headClosed = true
	}
	b.appendTail(name, text)
}

func (b *builder) appendHead(name, text string) {
	b.headBytes += len(text)
	b.appendLog(name, text)
}

// appendTail keeps text as the newest output, dropping the oldest of the
// tail past the limit.
func (b *builder) appendTail(name, text string) {
	limit := b.limits.LogBytes - b.headBytes
	if len(text) > limit {
		k := nextRuneStart(text, len(text)-limit)
		b.dropLog(name, k)
		text = strings.Clone(text[k:])
	}
	b.tail = append(b.tail, logChunk{name, text})
	b.tailBytes += len(text)
	for b.tailBytes > limit {
		c := &b.tail[b.tailStart]
		over := b.tailBytes - limit
		if over >= len(c.text) {
			b.dropLog(c.name, len(c.text))
			b.tailBytes -= len(c.text)
			*c = logChunk{}
			b.tailStart++
			continue
		}
		k := nextRuneStart(c.text, over)
		b.dropLog(c.name, k)
		b.tailBytes -= k
		c.text = c.text[k:]
		if len(c.text) < k { // not the whole message for a little of it
			c.text = strings.Clone(c.text)
		}
	}
	if b.tailStart > 64 && b.tailStart > len(b.tail)/2 {
		n := copy(b.tail, b.tail[b.tailStart:])
		clear(b.tail[n:])
		b.tail, b.tailStart = b.tail[:n], 0
	}
}

// dropLog counts n bytes of stream name dropped: the head ends here.
func (b *builder) dropLog(name string, n int) {
	if n <= 0 {
		return
	}
	b.headClosed = true
	b.droppedLog[streamIndex(name)] += n
	b.noteTruncation()
}

// runeStart is the start of the UTF-8 sequence at i of s, or at the last
// complete one before it: s[:runeStart(s, i)] ends on a whole character.
func runeStart(s string, i int) int {
	if i >= len(s) {
		return len(s)
	}
	for j := i; j > max(i-utf8.UTFMax, 0); j-- {
		if utf8.RuneStart(s[j]) {
			return j
		}
	}
	return max(i-utf8.UTFMax, 0)
}

// nextRuneStart is the start of the first UTF-8 sequence at or after i.
func nextRuneStart(s string, i int) int {
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return i
}

// noteTruncation marks the run truncated.
func (b *builder) noteTruncation() { b.exec.Truncated = true }

// flushTail ends the logs: the marker of each stream that lost bytes, then
// the tail, in the Execution and as events.
func (b *builder) flushTail() {
	for i, name := range [2]string{"stdout", "stderr"} {
		if n := b.droppedLog[i]; n > 0 {
			b.appendLog(name, jupyter.TruncationMarker(int64(n)))
		}
	}
	for _, c := range b.tail[b.tailStart:] {
		b.appendLog(c.name, c.text)
	}
	b.tail, b.tailStart, b.tailBytes = nil, 0, 0
	b.droppedLog = [2]int{}
}

func (b *builder) appendLog(name, text string) {
	if name == "stdout" {
		b.exec.Logs.Stdout = append(b.exec.Logs.Stdout, text)
	} else {
		b.exec.Logs.Stderr = append(b.exec.Logs.Stderr, text)
	}
	b.emit(name, textEvent{Text: text})
}

// finish closes the Execution with how the run ended.
func (b *builder) finish(reason Reason) {
	b.applyClear()
	if b.exec.Error == nil && b.replyError != nil {
		// The kernel reported its error only in the reply (Deno's
		// interrupted runs, aborted runs).
		b.setError(*b.replyError)
	}
	b.flushTail()
	if b.droppedData > 0 {
		b.appendLog("stderr", jupyter.TruncationMarker(int64(b.droppedData)))
	}
	b.exec.Process.Reason = reason
	var code *int
	switch reason {
	case Completed:
		code = intPtr(0)
	case Errored, Interrupted:
		code = intPtr(1)
	case TimedOut:
		if b.started {
			code = intPtr(1)
		}
	}
	b.exec.Process.ExitCode = code
}

func intPtr(i int) *int { return &i }

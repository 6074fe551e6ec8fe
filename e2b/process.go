package e2b

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"kernelgate/runs"
	"kernelgate/sessions"
)

// envd's process service (process.Process), as the SDK's commands call it
// over Connect with JSON: Start and Connect stream a command's events,
// List, SendInput, SendSignal and CloseStdin are unary. A command is a
// command run of the sessions manager beside the sandbox's default
// context's kernel, in the sandbox's workspace; its pid is a number this
// handler gives it (not the process's own).

// connectEndStream flags the last frame of a Connect stream.
const connectEndStream = 0x02

// maxConnectFrame bounds a streamed request's message.
const maxConnectFrame = 4 << 20

// defaultKeepalive is how long a command's stream stays quiet before a
// keepalive event when the SDK asks for none.
const defaultKeepalive = 50 * time.Second

// processTable maps the pids handed to the SDK to command runs.
type processTable struct {
	mu    sync.Mutex
	next  uint32
	procs map[uint32]*process
}

// process is a command of a sandbox.
type process struct {
	sandbox string
	run     *runs.Run
	config  processConfig
	tag     string
}

// processConfig is envd's ProcessConfig.
type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args"`
	Envs map[string]string `json:"envs"`
	Cwd  *string           `json:"cwd,omitempty"`
}

// selector is envd's ProcessSelector.
type selector struct {
	Pid *uint32 `json:"pid"`
	Tag *string `json:"tag"`
}

// add records a command and returns its pid.
func (t *processTable) add(p *process) uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pruneLocked()
	if t.procs == nil {
		t.procs = map[uint32]*process{}
		t.next = 1000
	}
	t.next++
	t.procs[t.next] = p
	return t.next
}

// pruneLocked forgets the commands that have ended: as soon as their end
// is known (and streamed), not once their record is stored too.
func (t *processTable) pruneLocked() {
	for pid, p := range t.procs {
		if p.run.State() == runs.RunDone {
			delete(t.procs, pid)
		}
	}
}

// find returns the running command of sandbox sb that s selects.
func (t *processTable) find(sb string, s selector) (uint32, *process, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pruneLocked()
	for pid, p := range t.procs {
		if p.sandbox != sb {
			continue
		}
		if (s.Pid != nil && *s.Pid == pid) || (s.Pid == nil && s.Tag != nil && *s.Tag != "" && *s.Tag == p.tag) {
			return pid, p, true
		}
	}
	return 0, nil, false
}

// list returns the running commands of sandbox sb.
func (t *processTable) list(sb string) map[uint32]*process {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pruneLocked()
	out := map[uint32]*process{}
	for pid, p := range t.procs {
		if p.sandbox == sb {
			out[pid] = p
		}
	}
	return out
}

// processRPC serves process.Process/{method}.
func (h *Handler) processRPC(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	if r.Method != http.MethodPost {
		rpcError(w, http.StatusMethodNotAllowed, "unimplemented", "Connect RPCs are POSTs")
		return
	}
	method := r.PathValue("method")
	switch method {
	case "Start", "Connect":
		h.processStream(w, r, sb, method)
	case "List", "SendInput", "SendSignal", "CloseStdin":
		h.processUnary(w, r, sb, method)
	case "Update", "StreamInput":
		rpcError(w, http.StatusNotImplemented, "unimplemented", "kernelgate runs commands without a terminal: no pty, no input stream (use sendStdin)")
	default:
		rpcError(w, http.StatusNotFound, "unimplemented", "no method process.Process/"+method)
	}
}

// processUnary serves the unary methods (plain JSON).
func (h *Handler) processUnary(w http.ResponseWriter, r *http.Request, sb *sandbox, method string) {
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		rpcError(w, http.StatusUnsupportedMediaType, "unimplemented", "only Connect's JSON encoding is served")
		return
	}
	var req struct {
		Process selector `json:"process"`
		Input   struct {
			Stdin *string `json:"stdin"`
		} `json:"input"`
		Signal json.RawMessage `json:"signal"`
	}
	if err := h.decode(r, &req); err != nil {
		rpcError(w, http.StatusBadRequest, "invalid_argument", "body: "+err.Error())
		return
	}
	if method == "List" {
		out := []map[string]any{}
		for pid, p := range h.procs.list(sb.id) {
			info := map[string]any{"pid": pid, "config": p.config}
			if p.tag != "" {
				info["tag"] = p.tag
			}
			out = append(out, info)
		}
		writeJSON(w, http.StatusOK, map[string]any{"processes": out})
		return
	}
	_, p, ok := h.procs.find(sb.id, req.Process)
	if !ok {
		rpcError(w, http.StatusNotFound, "not_found", "no running process with that selector in this sandbox")
		return
	}
	switch method {
	case "SendInput":
		if req.Input.Stdin == nil {
			rpcError(w, http.StatusBadRequest, "invalid_argument", "input.stdin is required (kernelgate runs no pty)")
			return
		}
		data, err := base64.StdEncoding.DecodeString(*req.Input.Stdin)
		if err != nil {
			if data, err = base64.URLEncoding.DecodeString(*req.Input.Stdin); err != nil {
				rpcError(w, http.StatusBadRequest, "invalid_argument", "input.stdin is not base64")
				return
			}
		}
		if err := p.run.Input(string(data)); err != nil {
			status, msg := h.cfg.Describe(err)
			code := "failed_precondition"
			if status == http.StatusRequestTimeout {
				code = "deadline_exceeded"
			}
			rpcError(w, connectStatus(code), code, msg)
			return
		}
	case "CloseStdin":
		if !p.run.CloseInput() {
			rpcError(w, http.StatusBadRequest, "failed_precondition", "the process was started without stdin, or its stdin is closed")
			return
		}
	case "SendSignal":
		switch sig := strings.Trim(string(req.Signal), `"`); sig {
		case "9", "SIGNAL_SIGKILL", "15", "SIGNAL_SIGTERM":
			// SIGTERM too ends the process group at once.
			p.run.Kill()
		default:
			rpcError(w, http.StatusBadRequest, "invalid_argument", "signal "+sig+" is not SIGKILL or SIGTERM")
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{})
}

// connectStatus is the HTTP status of a Connect error code.
func connectStatus(code string) int {
	switch code {
	case "invalid_argument", "failed_precondition":
		return http.StatusBadRequest
	case "deadline_exceeded":
		return http.StatusRequestTimeout
	case "not_found":
		return http.StatusNotFound
	case "unavailable":
		return http.StatusServiceUnavailable
	case "unimplemented":
		return http.StatusNotImplemented
	}
	return http.StatusInternalServerError
}

// readEnvelope reads the one message of a streaming call's request.
func readEnvelope(r io.Reader) ([]byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, fmt.Errorf("no enveloped message: %w", err)
	}
	n := binary.BigEndian.Uint32(head[1:])
	if head[0]&0x01 != 0 {
		return nil, errors.New("compressed messages are not served")
	}
	if n > maxConnectFrame {
		return nil, fmt.Errorf("message of %d bytes is over the limit", n)
	}
	msg := make([]byte, n)
	_, err := io.ReadFull(r, msg)
	return msg, err
}

// streamWriter writes a Connect stream's frames.
type streamWriter struct {
	w   http.ResponseWriter
	buf bytes.Buffer
}

func (s *streamWriter) frame(flag byte, v any) error {
	js, err := json.Marshal(v)
	if err != nil {
		return err
	}
	s.buf.Reset()
	s.buf.WriteByte(flag)
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(js)))
	s.buf.Write(n[:])
	s.buf.Write(js)
	if _, err := s.w.Write(s.buf.Bytes()); err != nil {
		return err
	}
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

func (s *streamWriter) event(ev any) error {
	return s.frame(0, map[string]any{"event": ev})
}

// end writes the end of the stream.
func (s *streamWriter) end() { s.frame(connectEndStream, map[string]any{}) }

// processStream serves Start and Connect: the start event, the command's
// output, its end.
func (h *Handler) processStream(w http.ResponseWriter, r *http.Request, sb *sandbox, method string) {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var body []byte
	var err error
	switch ct {
	case "application/connect+json":
		body, err = readEnvelope(http.MaxBytesReader(nil, r.Body, maxConnectFrame+5))
	case "application/json":
		body, err = io.ReadAll(http.MaxBytesReader(nil, r.Body, maxConnectFrame))
	default:
		rpcError(w, http.StatusUnsupportedMediaType, "unimplemented", "only Connect's JSON encoding is served")
		return
	}
	if err != nil {
		rpcError(w, http.StatusBadRequest, "invalid_argument", "body: "+err.Error())
		return
	}
	var req struct {
		Process json.RawMessage `json:"process"`
		Pty     json.RawMessage `json:"pty"`
		Tag     string          `json:"tag"`
		Stdin   *bool           `json:"stdin"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		rpcError(w, http.StatusBadRequest, "invalid_argument", "body: "+err.Error())
		return
	}
	var pid uint32
	var p *process
	if method == "Start" {
		if len(req.Pty) > 0 && string(req.Pty) != "null" {
			rpcError(w, http.StatusNotImplemented, "unimplemented", "kernelgate runs commands without a terminal: no pty")
			return
		}
		var cfg processConfig
		if err := json.Unmarshal(req.Process, &cfg); err != nil {
			rpcError(w, http.StatusBadRequest, "invalid_argument", "process: "+err.Error())
			return
		}
		if pid, p, err = h.startProcess(r, sb, cfg, req.Tag, req.Stdin != nil && *req.Stdin); err != nil {
			status, msg := h.cfg.Describe(err)
			code := "internal"
			switch status {
			case http.StatusBadRequest:
				code = "invalid_argument"
			case http.StatusNotFound:
				code = "not_found"
			case http.StatusConflict, http.StatusTooManyRequests:
				code = "failed_precondition"
			case http.StatusServiceUnavailable:
				code = "unavailable"
			}
			rpcError(w, connectStatus(code), code, msg)
			return
		}
	} else {
		var sel selector
		if err := json.Unmarshal(req.Process, &sel); err != nil {
			rpcError(w, http.StatusBadRequest, "invalid_argument", "process: "+err.Error())
			return
		}
		var ok bool
		if pid, p, ok = h.procs.find(sb.id, sel); !ok {
			rpcError(w, http.StatusNotFound, "not_found", "no running process with that selector in this sandbox")
			return
		}
	}
	w.Header().Set("Content-Type", "application/connect+json")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &streamWriter{w: w}
	if s.event(map[string]any{"start": map[string]uint32{"pid": pid}}) != nil {
		return
	}
	after := 0
	if method == "Connect" {
		after = p.run.LastSeq() // from now on, as envd does
	}
	h.followProcess(r, s, p.run, after, keepaliveOf(r))
}

// keepaliveOf reads the SDK's Keepalive-Ping-Interval (seconds).
func keepaliveOf(r *http.Request) time.Duration {
	if n, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval")); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return defaultKeepalive
}

// startProcess starts a command of Start's config in sb.
func (h *Handler) startProcess(r *http.Request, sb *sandbox, cfg processConfig, tag string, stdin bool) (uint32, *process, error) {
	if cfg.Cmd == "" {
		return 0, nil, fmt.Errorf("%w: process.cmd is required", sessions.ErrBadRequest)
	}
	argv := append([]string{cfg.Cmd}, cfg.Args...)
	// The SDK runs "/bin/bash -l -c cmd": a login shell would read the
	// system's profile and reset PATH, losing the kernel's environment.
	if (cfg.Cmd == "/bin/bash" || cfg.Cmd == "bash") && len(cfg.Args) > 0 && cfg.Args[0] == "-l" {
		argv = append([]string{cfg.Cmd}, cfg.Args[1:]...)
	}
	cwd := ""
	if cfg.Cwd != nil && *cfg.Cwd != "" {
		rel, err := relPath(*cfg.Cwd)
		if err != nil {
			return 0, nil, fmt.Errorf("%w: cwd: %v", sessions.ErrBadRequest, err)
		}
		cwd = rel
	}
	ctxID, err := h.defaultContext(r.Context(), sb, h.workspaceLanguage())
	if err != nil {
		return 0, nil, err
	}
	// The stream's deadline (the SDK's timeoutMs) bounds the command, as
	// envd's does; 0 or none is no limit, and more than a run may be given
	// is that (a header's milliseconds would overflow a Duration).
	var timeout time.Duration
	if ms, err := strconv.ParseInt(r.Header.Get("Connect-Timeout-Ms"), 10, 64); err == nil && ms > 0 {
		timeout = time.Duration(min(ms, int64(sessions.MaxRunTimeout/time.Millisecond))) * time.Millisecond
	}
	run, err := h.mgr.RunCommand(r.Context(), sessions.CommandRequest{
		Context: ctxID, Argv: argv, Cwd: cwd, Env: cfg.Envs, Timeout: timeout, Stdin: stdin,
	})
	if err != nil {
		return 0, nil, err
	}
	if cfg.Envs == nil {
		cfg.Envs = map[string]string{}
	}
	p := &process{sandbox: sb.id, run: run, config: cfg, tag: tag}
	return h.procs.add(p), p, nil
}

// followProcess writes the run's output events after seq after and its
// end; a client that goes away leaves the command running.
func (h *Handler) followProcess(r *http.Request, s *streamWriter, run *runs.Run, after int, keepalive time.Duration) {
	ctx := r.Context()
	last := after
	t := time.NewTimer(keepalive)
	defer t.Stop()
	for {
		events, changed, done := run.Events(last)
		for _, e := range events {
			last = e.Seq
			ev, ok := processEvent(e)
			if !ok {
				continue
			}
			if s.event(ev) != nil {
				return
			}
			if e.Type == "end" {
				s.end()
				return
			}
		}
		if done && len(events) == 0 {
			if end, ok := run.End(); ok {
				if ev, ok := processEvent(end); ok && s.event(ev) == nil {
					s.end()
				}
			}
			return
		}
		if len(events) > 0 {
			continue
		}
		t.Reset(keepalive)
		select {
		case <-changed:
		case <-t.C:
			if s.event(map[string]any{"keepalive": map[string]any{}}) != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// processEvent is envd's ProcessEvent for a run event: output as data,
// the end with the exit code; false for events envd has none of.
func processEvent(e runs.Event) (map[string]any, bool) {
	switch e.Type {
	case "stdout", "stderr":
		var ev struct {
			Text string `json:"text"`
		}
		if json.Unmarshal(e.JSON, &ev) != nil || ev.Text == "" {
			return nil, false
		}
		return map[string]any{"data": map[string]string{e.Type: base64.StdEncoding.EncodeToString([]byte(ev.Text))}}, true
	case "end":
		var ev struct {
			Process runs.ProcessState `json:"process"`
		}
		if json.Unmarshal(e.JSON, &ev) != nil {
			return nil, false
		}
		code := -1
		if ev.Process.ExitCode != nil {
			code = *ev.Process.ExitCode
		}
		end := map[string]any{"exitCode": code, "exited": ev.Process.Reason == runs.Completed, "status": processStatus(ev.Process, code)}
		if ev.Process.Reason != runs.Completed {
			msg := string(ev.Process.Reason)
			if ev.Process.Message != "" {
				msg += ": " + ev.Process.Message
			}
			end["error"] = msg
		}
		return map[string]any{"end": end}, true
	}
	return nil, false
}

// processStatus is how envd words a process's end.
func processStatus(p runs.ProcessState, code int) string {
	switch {
	case p.Reason == runs.Completed:
		return "exit status " + strconv.Itoa(code)
	case code > 128:
		return "signal: " + strconv.Itoa(code-128)
	}
	return string(p.Reason)
}

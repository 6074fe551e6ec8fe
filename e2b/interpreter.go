package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"kernelgate/internal/timefmt"
	"kernelgate/runs"
	"kernelgate/sessions"
)

// contextPrefix begins the id of every context of a sandbox.
func contextPrefix(sandboxID string) string { return "e2b-" + sandboxID + "-" }

// normalizeLanguage maps E2B's language names onto kernelgate's.
func normalizeLanguage(lang string) string {
	switch l := strings.ToLower(strings.TrimSpace(lang)); l {
	case "", "python", "python3", "py":
		return "python"
	case "js", "javascript", "node", "deno":
		return "javascript"
	case "ts", "typescript":
		return "typescript"
	default:
		return l
	}
}

// defaultContext returns the sandbox's context of a language, making it
// on first use.
func (h *Handler) defaultContext(ctx context.Context, sb *sandbox, language string) (string, error) {
	id := contextPrefix(sb.id) + language
	if _, err := h.mgr.Context(id); err == nil {
		return id, nil
	}
	_, err := h.mgr.CreateContext(ctx, sessions.ContextRequest{ID: id, Language: language, Workspace: sb.ws})
	if errors.Is(err, sessions.ErrNameConflict) { // made by a concurrent request
		return id, nil
	}
	return id, err
}

// executeBody is POST /execute as the SDK sends it.
type executeBody struct {
	Code      *string           `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

func (h *Handler) execute(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	var body executeBody
	if err := h.decode(r, &body); err != nil {
		textError(w, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	if body.Code == nil {
		textError(w, http.StatusBadRequest, "code is required")
		return
	}
	if body.ContextID != "" && body.Language != "" {
		textError(w, http.StatusBadRequest, "Only one of context_id or language can be provided")
		return
	}
	if len(body.EnvVars) > 0 {
		textError(w, http.StatusBadRequest, "envs per run are not supported: set them in code (os.environ, Deno.env)")
		return
	}
	ctxID := body.ContextID
	if ctxID == "" {
		var err error
		if ctxID, err = h.defaultContext(r.Context(), sb, normalizeLanguage(body.Language)); err != nil {
			h.describeText(w, err)
			return
		}
	} else if !strings.HasPrefix(ctxID, contextPrefix(sb.id)) {
		textError(w, http.StatusNotFound, "Context "+ctxID+" not found")
		return
	}
	run, err := h.mgr.Execute(r.Context(), sessions.ExecuteRequest{Code: *body.Code, Context: ctxID})
	if err != nil {
		if errors.Is(err, sessions.ErrNoSuchContext) || errors.Is(err, runs.ErrQueueClosed) {
			textError(w, http.StatusNotFound, "Context "+ctxID+" not found")
			return
		}
		h.describeText(w, err)
		return
	}
	h.stream(w, r, run)
}

// describeText writes an error of the sessions manager as plain text.
func (h *Handler) describeText(w http.ResponseWriter, err error) {
	status, msg := h.cfg.Describe(err)
	textError(w, status, msg)
}

// stream writes the run's events as E2B's NDJSON until its end; a client
// that goes away interrupts the run, as E2B's server does.
func (h *Handler) stream(w http.ResponseWriter, r *http.Request, run *runs.Run) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// The headers go now: the SDK's request timeout runs until they
	// arrive, its run timeout (timeoutMs) after.
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	ctx := r.Context()
	var (
		buf     bytes.Buffer
		last    int
		errSent bool
	)
	for {
		events, changed, done := run.Events(last)
		buf.Reset()
		for _, e := range events {
			last = e.Seq
			if e.Type == "error" {
				errSent = true
			}
			if f := run.Failure(); e.Type == "end" && f != nil && !errSent {
				// The run never started: its kernel did not.
				_, msg := h.cfg.Describe(f)
				js, _ := json.Marshal(errorLine{Type: "error", Name: "KernelStartFailed", Value: msg})
				buf.Write(append(js, '\n'))
				errSent = true
			}
			if err := translate(&buf, e, errSent); err != nil {
				h.cfg.Logger.Warn("e2b: event not translated", "type", e.Type, "err", err)
			}
		}
		if buf.Len() > 0 {
			if _, err := w.Write(buf.Bytes()); err != nil {
				run.Interrupt()
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if done && len(events) == 0 {
			return
		}
		if len(events) > 0 {
			continue
		}
		select {
		case <-changed:
		case <-ctx.Done():
			run.Interrupt()
			return
		}
	}
}

// The NDJSON lines of E2B's code-interpreter server.
type (
	outputLine struct {
		Type      string `json:"type"`
		Text      string `json:"text"`
		Timestamp string `json:"timestamp"`
	}
	errorLine struct {
		Type      string `json:"type"`
		Name      string `json:"name"`
		Value     string `json:"value"`
		Traceback string `json:"traceback"`
	}
	countLine struct {
		Type           string `json:"type"`
		ExecutionCount int    `json:"execution_count"`
	}
)

// translate appends the E2B lines of one kernelgate event to buf;
// errSent says an error line was written for the run already.
func translate(buf *bytes.Buffer, e runs.Event, errSent bool) error {
	line := func(v any) error {
		js, err := json.Marshal(v)
		if err != nil {
			return err
		}
		buf.Write(js)
		buf.WriteByte('\n')
		return nil
	}
	switch e.Type {
	case "stdout", "stderr":
		var ev struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal(e.JSON, &ev); err != nil {
			return err
		}
		return line(outputLine{Type: e.Type, Text: ev.Text, Timestamp: timefmt.Format(time.Now())})
	case "result":
		var res runs.Result
		if err := json.Unmarshal(e.JSON, &res); err != nil {
			return err
		}
		return line(resultLine(&res))
	case "error":
		var ev runs.ExecError
		if err := json.Unmarshal(e.JSON, &ev); err != nil {
			return err
		}
		return line(errorLine{Type: "error", Name: ev.Name, Value: ev.Value, Traceback: strings.Join(ev.Traceback, "\n")})
	case "end":
		var ev struct {
			ExecutionCount *int              `json:"executionCount"`
			Process        runs.ProcessState `json:"process"`
		}
		if err := json.Unmarshal(e.JSON, &ev); err != nil {
			return err
		}
		if ev.ExecutionCount != nil {
			if err := line(countLine{Type: "number_of_executions", ExecutionCount: *ev.ExecutionCount}); err != nil {
				return err
			}
		}
		if !errSent {
			switch ev.Process.Reason {
			case runs.Lost:
				line(errorLine{Type: "error", Name: "ContextRestarting", Value: "the kernel stopped during the run; the next run starts a fresh one. " + ev.Process.Message})
			case runs.TimedOut:
				line(errorLine{Type: "error", Name: "TimeoutError", Value: "the run timed out; the kernel was interrupted and keeps its state"})
			}
		}
		return line(map[string]string{"type": "end_of_execution"})
	}
	return nil // start, display updates, clears, keepalives: E2B has none
}

// knownMIME are the MIME types a result carries in fields of their own.
var knownMIME = map[string]string{
	"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
	"image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
	"application/json": "json", "application/javascript": "javascript", "e2b/data": "data", "e2b/chart": "chart",
}

// resultLine is a result as E2B's server sends it: a field per common
// MIME type, the others under extra.
func resultLine(r *runs.Result) map[string]any {
	out := map[string]any{"type": "result", "is_main_result": r.IsMainResult}
	extra := map[string]json.RawMessage{}
	for mt, raw := range r.Data {
		field, ok := knownMIME[mt]
		if !ok {
			extra[mt] = raw
			continue
		}
		switch field {
		case "json", "data", "chart":
			out[field] = raw
		default:
			var s string
			if json.Unmarshal(raw, &s) != nil {
				out[field] = raw
				continue
			}
			if field == "text" {
				s = runs.StripANSI(s) // Deno colours its values
			}
			if field == "text" && len(s) >= 2 && strings.HasPrefix(s, "'") && strings.HasSuffix(s, "'") {
				s = s[1 : len(s)-1] // E2B drops the quotes of a string's repr
			}
			out[field] = s
		}
	}
	if len(extra) > 0 {
		out["extra"] = extra
	}
	return out
}

// contextModel is a context as E2B shows it.
type contextModel struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// modelOf shows a context of sb, its working directory under /home/user.
func modelOf(c *sessions.Context, sb *sandbox) contextModel {
	cwd := home
	if rel, ok := strings.CutPrefix(c.Cwd, sb.ws.Dir()); ok {
		cwd = absPath(strings.Trim(rel, "/"))
	}
	return contextModel{ID: c.ID, Language: c.Language, Cwd: cwd}
}

// cwdOf maps E2B's cwd onto the workspace: /home/user is the workspace
// itself; another absolute path is passed on (and refused unless inside).
func cwdOf(cwd string) string {
	if rel, err := relPath(cwd); err == nil {
		return rel
	}
	return cwd
}

func (h *Handler) createContext(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	var body struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := h.decode(r, &body); err != nil {
		textError(w, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	c, err := h.mgr.CreateContext(r.Context(), sessions.ContextRequest{
		ID: contextPrefix(sb.id) + newSecret(8), Language: normalizeLanguage(body.Language), Workspace: sb.ws,
		Cwd: cwdOf(body.Cwd),
	})
	if err != nil {
		h.describeText(w, err)
		return
	}
	writeJSON(w, http.StatusOK, modelOf(c, sb))
}

func (h *Handler) listContexts(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	out := []contextModel{}
	for _, c := range h.mgr.Contexts() {
		if strings.HasPrefix(c.ID, contextPrefix(sb.id)) {
			out = append(out, modelOf(c, sb))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// sandboxContext returns the context id of the route if it is the
// sandbox's, or writes 404.
func sandboxContext(w http.ResponseWriter, r *http.Request, sb *sandbox) (string, bool) {
	id := r.PathValue("id")
	if !strings.HasPrefix(id, contextPrefix(sb.id)) {
		textError(w, http.StatusNotFound, "Context "+id+" not found")
		return "", false
	}
	return id, true
}

func (h *Handler) deleteContext(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	id, ok := sandboxContext(w, r, sb)
	if !ok {
		return
	}
	if err := h.mgr.DeleteContext(r.Context(), id); err != nil {
		if errors.Is(err, sessions.ErrNoSuchContext) {
			textError(w, http.StatusNotFound, "Context "+id+" not found")
			return
		}
		h.describeText(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *Handler) restartContext(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	id, ok := sandboxContext(w, r, sb)
	if !ok {
		return
	}
	c, err := h.mgr.Context(id)
	if err == nil {
		err = c.Restart(r.Context())
	}
	if err != nil {
		if errors.Is(err, sessions.ErrNoSuchContext) {
			textError(w, http.StatusNotFound, "Context "+id+" not found")
			return
		}
		h.describeText(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

package gateway

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"kernelgate/runs"
	"kernelgate/sessions"

	"kernelgate/internal/seconds"
	"kernelgate/internal/timefmt"
)

// executeBody is POST /api/execute.
type executeBody struct {
	Code       *string            `json:"code"`
	Language   string             `json:"language"`
	Kernelspec string             `json:"kernelspec"`
	Context    *string            `json:"context"`
	Isolated   bool               `json:"isolated"`
	Cwd        string             `json:"cwd"`
	Env        map[string]*string `json:"env"`
	Timeout    *float64           `json:"timeout"`
	Stdin      bool               `json:"stdin"`
	// Kind is "code" (the default) or "exec": code is then a command
	// run with /bin/sh -c beside the context's kernel, as
	// POST /api/contexts/{id}/commands runs it.
	Kind string `json:"kind"`
}

// streamFormat is how a run's events are written.
type streamFormat int

const (
	noStream streamFormat = iota
	ndjson
	sse
)

// wantStream reads the Accept header.
func wantStream(r *http.Request) streamFormat {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch mt {
		case "application/x-ndjson", "application/jsonl", "application/json-seq":
			return ndjson
		case "text/event-stream":
			return sse
		}
	}
	return noStream
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// envBody converts an env object; values must be strings.
func envBody(raw map[string]*string) (map[string]string, error) {
	if raw == nil {
		return nil, nil
	}
	env := make(map[string]string, len(raw))
	for k, v := range raw {
		if v == nil {
			return nil, newError(http.StatusBadRequest, "BAD_REQUEST", "env "+k+": values must be strings")
		}
		env[k] = *v
	}
	return env, nil
}

func (s *Server) execute(c echo.Context) error {
	var body executeBody
	if err := s.decodeBody(c, &body); err != nil {
		return err
	}
	if body.Code == nil {
		return newError(http.StatusBadRequest, "BAD_REQUEST", "code is required")
	}
	env, err := envBody(body.Env)
	if err != nil {
		return err
	}
	timeout, err := timeoutBody(body.Timeout)
	if err != nil {
		return err
	}
	if body.Context != nil && *body.Context == "" {
		return newError(http.StatusBadRequest, "BAD_REQUEST", `context "" names no context: omit context to run on the shared kernel`)
	}
	switch body.Kind {
	case "", "code":
	case "exec":
		return s.executeCommand(c, body, env, timeout)
	default:
		return newError(http.StatusBadRequest, "BAD_REQUEST", `kind must be "code" (the default) or "exec" (a command run with /bin/sh -c)`)
	}
	req := sessions.ExecuteRequest{
		Code: *body.Code, Language: body.Language, Kernelspec: body.Kernelspec, Context: deref(body.Context), Isolated: body.Isolated,
		Cwd: body.Cwd, Env: env, Timeout: timeout, Stdin: body.Stdin,
	}
	if p, _ := c.Get(principalKey).(principal); p.context != "" {
		if req.Context == "" {
			return newError(http.StatusForbidden, "FORBIDDEN", "a context token runs code only in its context: set context")
		}
		if err := s.checkContext(c, req.Context); err != nil {
			return err
		}
	}
	format := wantStream(c.Request())
	if req.Stdin && format == noStream {
		return newError(http.StatusBadRequest, "BAD_REQUEST", "stdin needs a streamed run: send Accept: application/x-ndjson or text/event-stream")
	}
	req.Wait = format == noStream
	req.Forwarded = forwardedRunOf(c)
	run, err := s.mgr.Execute(c.Request().Context(), req)
	if err != nil {
		return s.forwardShared(c, err)
	}
	c.Response().Header().Set("X-Run-Id", run.ID)
	if format != noStream {
		return s.streamRun(c, run, resumeAfter(c), format)
	}
	// The run outlives this request: a client that goes away loses only
	// the answer, which stays readable at /api/runs/{id}.
	if err := run.Wait(c.Request().Context()); err != nil {
		return nil
	}
	if req.Forwarded.ID != "" && run.Forgotten() {
		return notOwnerOfRun(c, run)
	}
	if f := run.Failure(); f != nil {
		return f
	}
	js := run.ExecutionJSON()
	// Its length, so that a client reads megabytes of output into one
	// buffer of the right size rather than one that doubles.
	c.Response().Header().Set(echo.HeaderContentLength, strconv.Itoa(len(js)))
	return c.JSONBlob(http.StatusOK, js)
}

// keepaliveEvery is how long a stream stays quiet before a keepalive.
var keepaliveEvery = 5 * time.Second

// streamRun writes the run's events after seq `after` and follows it live
// until its end.
func (s *Server) streamRun(c echo.Context, run *runs.Run, after int, format streamFormat) error {
	w := c.Response()
	h := w.Header()
	if format == sse {
		h.Set("Content-Type", "text/event-stream")
	} else {
		h.Set("Content-Type", "application/x-ndjson")
	}
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	if !w.Committed { // a run resumed here for a client it was relayed to
		w.WriteHeader(http.StatusOK)
	}
	// A run forwarded here that this replica let go (its lease lost)
	// does not end here: its stream stops before its end, and the
	// replica that forwarded it asks the new owner for the rest.
	forwarded := forwardedRunOf(c).ID != ""
	ctx := c.Request().Context()
	var buf bytes.Buffer
	write := func(seq int, js []byte) error {
		buf.Reset()
		if format == sse {
			fmt.Fprintf(&buf, "id: %d\ndata: ", seq)
			buf.Write(js)
			buf.WriteString("\n\n")
		} else {
			buf.Write(js)
			buf.WriteByte('\n')
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return err
		}
		w.Flush()
		return nil
	}
	last := after
	for {
		events, changed, done := run.Events(last)
		for _, e := range events {
			if forwarded && e.Type == "end" && run.Forgotten() {
				return nil
			}
			if err := write(e.Seq, e.JSON); err != nil {
				return nil
			}
			last = e.Seq
		}
		if done && len(events) == 0 {
			if last == after {
				// Asked for what follows the end: the end again, so
				// the client learns the run is over.
				if end, ok := run.End(); ok && last >= end.Seq {
					write(end.Seq, end.JSON)
				}
			}
			return nil
		}
		if len(events) > 0 {
			continue
		}
		t := time.NewTimer(keepaliveEvery)
		select {
		case <-changed:
			t.Stop()
		case <-t.C:
			if err := write(last, runs.KeepaliveJSON(last)); err != nil {
				return nil
			}
		case <-ctx.Done():
			t.Stop()
			return nil
		}
	}
}

// run returns the run of the route, checking a context token against it.
func (s *Server) run(c echo.Context) (*runs.Run, error) {
	run, err := s.mgr.Run(c.Param("id"))
	if err != nil {
		return nil, err
	}
	if err := s.checkContext(c, run.Context); err != nil {
		return nil, err
	}
	return run, nil
}

func (s *Server) getRun(c echo.Context) error {
	run, err := s.run(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, run.Model())
}

func (s *Server) runEvents(c echo.Context) error {
	run, err := s.run(c)
	if err != nil {
		return err
	}
	after := 0
	if a := c.QueryParam("after"); a != "" {
		n, err := strconv.Atoi(a)
		if err != nil || n < 0 {
			return newError(http.StatusBadRequest, "BAD_REQUEST", "after is the seq of the last event received (a number)")
		}
		after = n
	}
	if id := c.Request().Header.Get("Last-Event-ID"); id != "" && c.QueryParam("after") == "" {
		if n, err := strconv.Atoi(id); err == nil && n >= 0 {
			after = n
		}
	}
	format := wantStream(c.Request())
	if format == noStream {
		format = ndjson
	}
	return s.streamRun(c, run, after, format)
}

func (s *Server) interruptRun(c echo.Context) error {
	run, err := s.run(c)
	if err != nil {
		return err
	}
	run.Interrupt()
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) inputRun(c echo.Context) error {
	run, err := s.run(c)
	if err != nil {
		return err
	}
	var body struct {
		Value *string `json:"value"`
		EOF   bool    `json:"eof"`
	}
	if err := s.decodeBody(c, &body); err != nil {
		return err
	}
	if body.Value == nil && !body.EOF {
		return newError(http.StatusBadRequest, "BAD_REQUEST", "value is required")
	}
	if body.Value != nil {
		if err := run.Input(*body.Value); err != nil {
			return err
		}
	}
	if body.EOF && !run.CloseInput() {
		return newError(http.StatusBadRequest, "BAD_REQUEST", "eof closes the input of a command started with stdin: true; this run has none open")
	}
	return c.NoContent(http.StatusNoContent)
}

// contextBody is POST /api/contexts.
type contextBody struct {
	ID         *string            `json:"id"`
	Language   string             `json:"language"`
	Kernelspec string             `json:"kernelspec"`
	Cwd        string             `json:"cwd"`
	Env        map[string]*string `json:"env"`
	Packages   []string           `json:"packages"`
}

func (s *Server) createContext(c echo.Context) error {
	var body contextBody
	if err := s.decodeBody(c, &body); err != nil {
		return err
	}
	if body.ID != nil && *body.ID == "" {
		return newError(http.StatusBadRequest, "BAD_REQUEST", `context id "": omit id to have one generated`)
	}
	env, err := envBody(body.Env)
	if err != nil {
		return err
	}
	ctx, err := s.mgr.CreateContext(c.Request().Context(), sessions.ContextRequest{ID: deref(body.ID), Language: body.Language, Kernelspec: body.Kernelspec, Cwd: body.Cwd, Env: env, Packages: body.Packages})
	if err != nil {
		return err
	}
	c.Response().Header().Set("Location", s.path("api/contexts/"+ctx.ID))
	return c.JSON(http.StatusCreated, ctx.Model())
}

func (s *Server) listContexts(c echo.Context) error {
	if s.clustered(c) {
		return s.listClusterContexts(c)
	}
	cs := s.mgr.Contexts()
	out := make([]sessions.ContextModel, 0, len(cs))
	for _, ctx := range cs {
		out = append(out, ctx.Model())
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) getContext(c echo.Context) error {
	if err := s.checkContext(c, c.Param("id")); err != nil {
		return err
	}
	ctx, err := s.mgr.Context(c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ctx.Model())
}

func (s *Server) deleteContext(c echo.Context) error {
	if err := s.mgr.DeleteContext(c.Request().Context(), c.Param("id")); err != nil {
		return err
	}
	s.tokens.revoke(c.Param("id"))
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) interruptContext(c echo.Context) error {
	if err := s.checkContext(c, c.Param("id")); err != nil {
		return err
	}
	ctx, err := s.mgr.Context(c.Param("id"))
	if err != nil {
		return err
	}
	if err := ctx.Interrupt(c.Request().Context()); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) restartContext(c echo.Context) error {
	if err := s.checkContext(c, c.Param("id")); err != nil {
		return err
	}
	ctx, err := s.mgr.Context(c.Param("id"))
	if err != nil {
		return err
	}
	if err := ctx.Restart(c.Request().Context()); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ctx.Model())
}

// revokeContextTokens revokes every token minted for one context, kept
// ones included: they fail from now on, also after a restart.
func (s *Server) revokeContextTokens(c echo.Context) error {
	id := c.Param("id")
	ctx, err := s.mgr.Context(id)
	if err != nil {
		return err
	}
	s.tokens.revoke(id)
	s.closeTokenSockets(id)
	ctx.RevokeTokens()
	s.log.Info("context tokens revoked", "context", id)
	return c.NoContent(http.StatusNoContent)
}

// revokeAllContextTokens revokes every context token of every context.
func (s *Server) revokeAllContextTokens(c echo.Context) error {
	s.tokens.revokeAll()
	s.closeTokenSockets("")
	s.mgr.RevokeAllContextTokens()
	if s.clustered(c) {
		if missed := s.revokeOnPeers(c); len(missed) > 0 {
			s.log.Warn("context tokens revoked here, but not confirmed by every replica", "replicas", missed)
			c.Response().Header().Set("Retry-After", "1")
			return newError(http.StatusServiceUnavailable, "UNAVAILABLE",
				"context tokens revoked here and on the replicas that answered; not confirmed by "+strings.Join(missed, ", ")+": retry")
		}
	}
	s.log.Info("every context token revoked")
	return c.NoContent(http.StatusNoContent)
}

// mintContextToken makes a token that can run code in one context.
func (s *Server) mintContextToken(c echo.Context) error {
	ctx, err := s.mgr.Context(c.Param("id"))
	if err != nil {
		return err
	}
	var body struct {
		TTL *float64 `json:"ttl"`
	}
	if err := s.decodeBody(c, &body); err != nil {
		return err
	}
	ttl := min(time.Hour, s.cfg.MaxContextTokenTTL)
	if body.TTL != nil {
		// Bounded before it becomes a duration: a number of seconds past
		// 292 years would wrap to a time in the past.
		var ok bool
		if ttl, ok = seconds.Of(*body.TTL, s.cfg.MaxContextTokenTTL); !ok || ttl <= 0 {
			return newError(http.StatusBadRequest, "BAD_REQUEST",
				fmt.Sprintf("ttl is a number of seconds above 0 and at most %s (%v)", seconds.Format(s.cfg.MaxContextTokenTTL), s.cfg.MaxContextTokenTTL))
		}
	}
	tok, exp := s.tokens.mint(ctx.ID, ctx.Created(), ttl)
	// Kept with the context (hashed): with a state store the token
	// works after a restart.
	ctx.KeepToken(sessions.ContextToken{Hash: sha256.Sum256([]byte(tok)), Expires: exp})
	return c.JSON(http.StatusCreated, map[string]string{"token": tok, "expiresAt": timefmt.Format(exp)})
}

// executeCommand is POST /api/execute with kind "exec": code is a
// command run with /bin/sh -c beside the kernel of the context named (or
// of the language's shared context), the same run as a command of
// POST /api/contexts/{id}/commands, answered as a run of code is.
func (s *Server) executeCommand(c echo.Context, body executeBody, env map[string]string, timeout time.Duration) error {
	if *body.Code == "" {
		return newError(http.StatusBadRequest, "BAD_REQUEST", "code is required: the command to run")
	}
	if body.Isolated {
		return newError(http.StatusBadRequest, "BAD_REQUEST", "an isolated run takes code only: create a context to run a command in")
	}
	id := deref(body.Context)
	if p, _ := c.Get(principalKey).(principal); p.context != "" {
		if id == "" {
			return newError(http.StatusForbidden, "FORBIDDEN", "a context token runs commands only in its context: set context")
		}
	}
	if id != "" {
		if err := s.checkContext(c, id); err != nil {
			return err
		}
	}
	format := wantStream(c.Request())
	if body.Stdin && format == noStream {
		return newError(http.StatusBadRequest, "BAD_REQUEST", "stdin needs a streamed run: send Accept: application/x-ndjson or text/event-stream")
	}
	run, err := s.mgr.RunCommand(c.Request().Context(), sessions.CommandRequest{
		Context: id, Language: body.Language, Kernelspec: body.Kernelspec,
		Argv: sessions.ShellCommand(*body.Code), Cwd: body.Cwd, Env: env, Timeout: timeout, Stdin: body.Stdin,
		Forwarded: forwardedRunOf(c),
	})
	if err != nil {
		return s.forwardShared(c, err)
	}
	c.Response().Header().Set("X-Run-Id", run.ID)
	if format != noStream {
		return s.streamRun(c, run, resumeAfter(c), format)
	}
	if err := run.Wait(c.Request().Context()); err != nil {
		return nil
	}
	js := run.ExecutionJSON()
	c.Response().Header().Set(echo.HeaderContentLength, strconv.Itoa(len(js)))
	return c.JSONBlob(http.StatusOK, js)
}

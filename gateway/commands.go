package gateway

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"kernelgate/internal/seconds"
	"kernelgate/sessions"
)

// commandBody is POST /api/contexts/{id}/commands.
type commandBody struct {
	Cmd        json.RawMessage    `json:"cmd"`
	Cwd        string             `json:"cwd"`
	Env        map[string]*string `json:"env"`
	Timeout    *float64           `json:"timeout"`
	Stdin      bool               `json:"stdin"`
	Background bool               `json:"background"`
}

// commandArgv reads cmd: a string runs under /bin/sh -c, a list of
// strings is the argv.
func commandArgv(raw json.RawMessage) ([]string, error) {
	bad := newError(http.StatusBadRequest, "BAD_REQUEST", `cmd is required: a string run with /bin/sh -c, or a list of strings (the program and its arguments)`)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, bad
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return nil, bad
		}
		return sessions.ShellCommand(s), nil
	}
	var argv []string
	if err := json.Unmarshal(raw, &argv); err != nil || len(argv) == 0 {
		return nil, bad
	}
	return argv, nil
}

// timeoutBody reads a timeout in seconds.
func timeoutBody(t *float64) (time.Duration, error) {
	if t == nil {
		return 0, nil
	}
	d, ok := seconds.Of(*t, sessions.MaxRunTimeout)
	if !ok {
		return 0, newError(http.StatusBadRequest, "BAD_REQUEST", sessions.TimeoutRange)
	}
	return d, nil
}

// runCommand starts a command beside a context's kernel: the Execution
// once it ended, its events streamed, or 202 {"run"} in the background.
func (s *Server) runCommand(c echo.Context) error {
	id := c.Param("id")
	if err := s.checkContext(c, id); err != nil {
		return err
	}
	var body commandBody
	if err := s.decodeBody(c, &body); err != nil {
		return err
	}
	argv, err := commandArgv(body.Cmd)
	if err != nil {
		return err
	}
	env, err := envBody(body.Env)
	if err != nil {
		return err
	}
	timeout, err := timeoutBody(body.Timeout)
	if err != nil {
		return err
	}
	format := wantStream(c.Request())
	if body.Stdin && format == noStream && !body.Background {
		return newError(http.StatusBadRequest, "BAD_REQUEST", "stdin needs a streamed or background command: send Accept: application/x-ndjson or text/event-stream, or background: true")
	}
	run, err := s.mgr.RunCommand(c.Request().Context(), sessions.CommandRequest{
		Context: id, Argv: argv, Cwd: body.Cwd, Env: env, Timeout: timeout, Stdin: body.Stdin,
		Forwarded: forwardedRunOf(c),
	})
	if err != nil {
		return err
	}
	c.Response().Header().Set("X-Run-Id", run.ID)
	switch {
	case body.Background:
		return c.JSON(http.StatusAccepted, map[string]string{"run": run.ID})
	case format != noStream:
		return s.streamRun(c, run, resumeAfter(c), format)
	}
	// The command outlives this request, as a run of code does.
	if err := run.Wait(c.Request().Context()); err != nil {
		return nil
	}
	js := run.ExecutionJSON()
	c.Response().Header().Set(echo.HeaderContentLength, strconv.Itoa(len(js)))
	return c.JSONBlob(http.StatusOK, js)
}

// killRun sends SIGKILL to a command's process group (a run of code is
// interrupted).
func (s *Server) killRun(c echo.Context) error {
	run, err := s.run(c)
	if err != nil {
		return err
	}
	run.Kill()
	return c.NoContent(http.StatusNoContent)
}

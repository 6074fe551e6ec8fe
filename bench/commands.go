//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"
)

// benchCommands measures `echo hi` run as a command beside a Python
// context's kernel (POST /api/contexts/{id}/commands: a process started
// behind the kernel's gate, in its cgroup, read to its end) against `1+1`
// as code in a context (POST /api/execute), one of each in turn on
// keep-alive connections, in a new order every turn.
func (b *bench) benchCommands(ctx context.Context) error {
	sctx, cancel := within(ctx, 10*time.Minute)
	defer cancel()
	s := b.kg
	rest, closeREST, err := restSystem(sctx, s, "python")
	if err != nil {
		return err
	}
	defer closeREST()
	id, _, err := s.createContext(sctx, "python")
	if err != nil {
		return err
	}
	defer s.deleteContext(context.Background(), id)
	conn, err := newPostConn(s)
	if err != nil {
		return err
	}
	defer conn.Close()
	headers := map[string]string{"Authorization": "token " + s.token}
	body := []byte(`{"cmd":"echo hi"}`)
	path := "/api/contexts/" + id + "/commands"
	cmd := &rtSystem{runs: []func(context.Context) (outcome, error){func(ctx context.Context) (outcome, error) {
		status, out, err := conn.post(ctx, path, headers, body)
		if err != nil {
			return outcome{}, err
		}
		return commandOutcome(status, out)
	}}}
	systems := []*rtSystem{rest, cmd}
	progress("commands: %d warm-up round trips each", b.opt.warmup)
	for range b.opt.warmup {
		for _, sys := range systems {
			if err := sys.step(sctx); err != nil {
				return err
			}
		}
	}
	for _, sys := range systems {
		sys.lat, sys.late = nil, 0
	}
	order := rand.New(rand.NewPCG(3, uint64(len(systems))))
	for i := range b.opt.roundTrips {
		if i%100 == 0 {
			progress("commands: round trip %d of %d", i, b.opt.roundTrips)
		}
		for _, j := range order.Perm(len(systems)) {
			if err := systems[j].step(sctx); err != nil {
				return err
			}
		}
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }
	b.add(row{
		figure: "commands: `echo hi` as a command (POST /api/contexts/{id}/commands) vs python `1+1` as code (POST /api/execute), ms p50 / p90",
		kg:     ms(cmd.lat.p50()) + " / " + ms(cmd.lat.p90()), direct: ms(rest.lat.p50()) + " / " + ms(rest.lat.p90()) + " (code)",
		ratios: fmt.Sprintf("p50 %.2f× code (%+.2f ms)", float64(cmd.lat.p50())/float64(rest.lat.p50()), float64((cmd.lat.p50()-rest.lat.p50()).Microseconds())/1000),
	})
	return nil
}

// commandOutcome reads a command's Execution: it must have printed hi and
// exited 0.
func commandOutcome(status int, body []byte) (outcome, error) {
	if status != http.StatusOK {
		return outcome{}, fmt.Errorf("POST commands: %d %s", status, body)
	}
	var e struct {
		Logs struct {
			Stdout []string `json:"stdout"`
		} `json:"logs"`
		Process struct {
			ExitCode *int `json:"exitCode"`
		} `json:"process"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		return outcome{}, fmt.Errorf("POST commands: %w: %s", err, body)
	}
	if len(e.Logs.Stdout) != 1 || e.Logs.Stdout[0] != "hi\n" || e.Process.ExitCode == nil || *e.Process.ExitCode != 0 {
		return outcome{}, fmt.Errorf("POST commands: %s", body)
	}
	return outcome{status: "ok", text: "2"}, nil
}

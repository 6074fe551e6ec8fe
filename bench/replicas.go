//go:build linux

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"kernelgate/internal/pgtest"
)

// failoverLease is the --lease of the replicas whose owners the failover
// trials kill; failoverPoll and failoverRequest how often and how long
// the survivor is asked for the context's state meanwhile.
const (
	failoverLease   = 2 * time.Second
	failoverPoll    = 25 * time.Millisecond
	failoverRequest = time.Second
)

// benchReplicas measures replicas on one PostgreSQL (docs/replicas.md),
// each a kernelgate with --state-url and the cluster secret, on a
// private PostgreSQL server (internal/pgtest):
//   - POST /api/execute of 1+1 in a Python context through a replica
//     that forwards it to the context's owner, against the same through
//     the owner, one for one (benchForward);
//   - the load section's shape (opt.loadKernels Python contexts ×
//     opt.loadClients clients) spread over three replicas, each client
//     taking the replicas in turn request by request, against one
//     gateway on PostgreSQL and one on bbolt (benchReplicaLoad);
//   - failover: the time from the SIGKILL of a context's owner to the
//     first answer carrying the context's state through another
//     replica, with --lease failoverLease, over opt.failovers trials
//     (benchFailover).
//
// It runs alone with -only replicas. Without PostgreSQL the rows say so.
func (b *bench) benchReplicas(ctx context.Context) error {
	srv, err := pgtest.Launch()
	if errors.Is(err, pgtest.ErrMissing) {
		for _, f := range []string{forwardFigure, b.replicaLoadFigure(), failoverFigure} {
			b.add(row{figure: f, kg: "—", ratios: err.Error()})
		}
		return nil
	}
	if err != nil {
		return err
	}
	defer srv.Close()
	dir, err := os.MkdirTemp("", "kgbench-replicas-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	progress("replicas: starting three replicas (default --lease)")
	rs, err := newReplicaSet(ctx, srv, "replicas", dir, 3)
	if err != nil {
		return err
	}
	defer rs.stop()
	if err := b.benchForward(ctx, rs.live[0], rs.live[1]); err != nil {
		return err
	}
	if err := b.benchReplicaLoad(ctx, srv, rs); err != nil {
		return err
	}
	rs.stop()

	progress("replicas: starting three replicas with --lease %v for failover", failoverLease)
	fs, err := newReplicaSet(ctx, srv, "failover", dir, 3, "--lease", failoverLease.String())
	if err != nil {
		return err
	}
	defer fs.stop()
	return b.benchFailover(ctx, fs)
}

const (
	forwardFigure  = "POST /api/execute 1+1, Python context, through a replica that forwards it to the owner (3 replicas on one PostgreSQL)"
	failoverFigure = "Failover: the owner SIGKILLed → the first answer with the context's state (`x`) through another replica (3 replicas on one PostgreSQL)"
)

func (b *bench) replicaLoadFigure() string {
	return fmt.Sprintf("runs/s, %d Python contexts × %d clients, spread over 3 replicas on one PostgreSQL (each client takes the replicas in turn)",
		b.opt.loadKernels, b.opt.loadClients)
}

// replicaSet is kernelgate replicas on one database of a PostgreSQL
// server, sharing a workspace root.
type replicaSet struct {
	name string
	args []string  // every replica's flags
	live []*server // in the order started
	dead []*server // killed, stopped with the set
	n    int       // replicas started
}

// newReplicaSet creates the database db and starts n replicas on it,
// and returns once each sees them all live.
func newReplicaSet(ctx context.Context, srv *pgtest.Server, db, dir string, n int, extra ...string) (*replicaSet, error) {
	url, err := srv.CreateDB(db)
	if err != nil {
		return nil, err
	}
	root := filepath.Join(dir, db+"-workspaces")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	rs := &replicaSet{name: db, args: append([]string{"--pool-size", "0", "--state-url", url, "--workspace-root", root}, extra...), n: n}
	started := make([]*server, n)
	err = parallel(n, n, func(i int) error {
		sctx, cancel := within(ctx, 2*time.Minute)
		defer cancel()
		var err error
		started[i], err = startKernelgate(sctx, fmt.Sprintf("kernelgate (%s replica %d)", rs.name, i+1), kernelgateBin, rs.args...)
		return err
	})
	for _, s := range started {
		if s != nil {
			rs.live = append(rs.live, s)
		}
	}
	if err != nil {
		rs.stop()
		return nil, err
	}
	if err := rs.waitLive(ctx); err != nil {
		rs.stop()
		return nil, err
	}
	return rs, nil
}

// start starts one more replica (after one killed).
func (rs *replicaSet) start(ctx context.Context) (*server, error) {
	sctx, cancel := within(ctx, 2*time.Minute)
	defer cancel()
	rs.n++
	s, err := startKernelgate(sctx, fmt.Sprintf("kernelgate (%s replica %d)", rs.name, rs.n), kernelgateBin, rs.args...)
	if err != nil {
		return nil, err
	}
	rs.live = append(rs.live, s)
	return s, nil
}

// advertised is the URL a replica of the harness advertises: the address
// it listens on.
func advertised(s *server) string { return strings.TrimSuffix(s.url, "/") }

// waitLive waits until every live replica's GET /api/status lists all
// of them as live.
func (rs *replicaSet) waitLive(ctx context.Context) error {
	wctx, cancel := within(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for _, s := range rs.live {
		for {
			var st struct {
				Replicas []string `json:"replicas"`
			}
			err := s.expect(wctx, 200, "GET", "api/status", nil, &st)
			all := err == nil
			for _, o := range rs.live {
				all = all && slices.Contains(st.Replicas, advertised(o))
			}
			if all {
				break
			}
			select {
			case <-wctx.Done():
				return fmt.Errorf("%s: the replicas %v are not all live (%v): %w", s.name, st.Replicas, err, wctx.Err())
			case <-tick.C:
			}
		}
	}
	return nil
}

// kill SIGKILLs the replica s (its process alone: its kernels live on
// for another replica to adopt) and waits for its end.
func (rs *replicaSet) kill(s *server) {
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.waited
	rs.live = slices.DeleteFunc(rs.live, func(o *server) bool { return o == s })
	rs.dead = append(rs.dead, s)
}

// stop stops every replica (idempotent).
func (rs *replicaSet) stop() { stopAll(slices.Concat(rs.live, rs.dead)...) }

// stopAll stops the servers at once, each shutting its kernels down.
func stopAll(servers ...*server) {
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Go(s.stop)
	}
	wg.Wait()
}

// ownedContext creates a Python context through s and checks that s
// owns it (a gateway that is no replica names no owner).
func ownedContext(ctx context.Context, s *server) (string, error) {
	cctx, cancel := within(ctx, 2*time.Minute)
	defer cancel()
	var c struct {
		ID      string `json:"id"`
		Replica string `json:"replica"`
	}
	if err := s.expect(cctx, 201, "POST", "api/contexts", map[string]string{"language": "python"}, &c); err != nil {
		return "", err
	}
	if c.Replica != "" && c.Replica != advertised(s) {
		return "", fmt.Errorf("%s: a context created here is owned by %q", s.name, c.Replica)
	}
	return c.ID, nil
}

// benchForward times 1+1 in a context owner owns, through other (which
// forwards it) and through owner in turn, and checks that forwarding
// adds at most 0.3 ms (paired).
func (b *bench) benchForward(ctx context.Context, owner, other *server) error {
	id, err := ownedContext(ctx, owner)
	if err != nil {
		return err
	}
	defer owner.deleteContext(context.Background(), id)
	body, _ := json.Marshal(map[string]any{"context": id, "code": "1+1"})
	var conns []*restConn
	for _, s := range []*server{other, owner} {
		c, err := newRESTConn(s)
		if err != nil {
			return err
		}
		defer c.Close()
		conns = append(conns, c)
	}
	lats, err := b.interleavedExecutes(ctx, "replicas: forwarded latency", conns, [][]byte{body, body})
	if err != nil {
		return err
	}
	fwd, own := lats[0], lats[1]
	b.add(row{figure: forwardFigure, kg: lat(fwd), ratios: "forwarded − owner paired " + fmtPaired(fwd, own)})
	b.add(row{figure: "POST /api/execute 1+1, Python context, through its owner (the same context, in turn)", kg: lat(own)})
	b.check("POST /api/execute `1+1` through a replica that forwards it to the owner within +0.3 ms of the owner (paired)",
		paired(fwd, own) <= 300*time.Microsecond,
		"paired difference %s, p50 %s against %s ms", fmtPaired(fwd, own), fmtMS(fwd.p50()), fmtMS(own.p50()))
	return nil
}

// spreadLoad is the load section's REST load on a set of gateways: the
// contexts created on them in turn, each client sending its i-th
// request to the gateway (client + i) mod n.
type spreadLoad struct {
	servers  []*server
	contexts []string
	conns    [][]*restConn // [client][gateway]
	next     []int         // per client: its requests so far
}

func (b *bench) setupSpreadLoad(ctx context.Context, servers []*server) (*spreadLoad, error) {
	o := b.opt
	l := &spreadLoad{servers: servers, contexts: make([]string, o.loadKernels)}
	err := parallel(o.loadKernels, 4, func(i int) error {
		return b.retry(func() error {
			var err error
			l.contexts[i], err = ownedContext(ctx, servers[i%len(servers)])
			return err
		})
	})
	if err != nil {
		return l, err
	}
	for range o.loadKernels * o.loadClients {
		var cs []*restConn
		for _, s := range servers {
			c, err := newRESTConn(s)
			if err != nil {
				return l, err
			}
			cs = append(cs, c)
		}
		l.conns = append(l.conns, cs)
	}
	l.next = make([]int, len(l.conns))
	return l, nil
}

// close closes the connections; the contexts go with their gateways.
func (l *spreadLoad) close() {
	for _, cs := range l.conns {
		for _, c := range cs {
			c.Close()
		}
	}
}

// phase is the load on the gateways as a loadPhase; CPU is the
// gateways' processes' together.
func (l *spreadLoad) phase(name string, count int) loadPhase {
	workers := len(l.conns)
	bodies := make([][]byte, workers)
	for w := range bodies {
		bodies[w], _ = json.Marshal(map[string]any{"code": "1+1", "context": l.contexts[w%len(l.contexts)]})
	}
	return loadPhase{name: name, res: &loadResult{}, workers: workers, count: count,
		cpu: func() time.Duration {
			var sum time.Duration
			for _, s := range l.servers {
				d, _ := cpuTime(s.pid())
				sum += d
			}
			return sum
		},
		exec: func(ctx context.Context, w int) (bool, error) {
			// Each worker alone touches l.next[w] and l.conns[w].
			c := l.conns[w][(w+l.next[w])%len(l.servers)]
			l.next[w]++
			missing, err := c.execute(ctx, bodies[w], "2")
			if err != nil {
				c.Close() // a broken connection is dialled again
				c.conn = nil
			}
			return missing, err
		}}
}

// benchReplicaLoad runs the load section's shape of REST load, Python
// contexts, on the replicas of rs, on one gateway on a PostgreSQL
// database of its own and on one on bbolt, the three in turn.
func (b *bench) benchReplicaLoad(ctx context.Context, srv *pgtest.Server, rs *replicaSet) error {
	o := b.opt
	url, err := srv.CreateDB("single")
	if err != nil {
		return err
	}
	sctx, cancel := within(ctx, 10*time.Minute)
	defer cancel()
	pg, err := startKernelgate(sctx, "kernelgate (one gateway, PostgreSQL)", kernelgateBin, "--pool-size", "0", "--state-url", url)
	if err != nil {
		return err
	}
	bolt, err := startKernelgate(sctx, "kernelgate (one gateway, bbolt)", kernelgateBin, "--pool-size", "0")
	if err != nil {
		pg.stop()
		return err
	}
	// Both stop at once, with their kernels, when the load is done.
	defer stopAll(pg, bolt)
	systems := []struct {
		name    string
		servers []*server
	}{{"3 replicas", rs.live}, {"one gateway on PostgreSQL", []*server{pg}}, {"one gateway on bbolt", []*server{bolt}}}
	var phases []loadPhase
	for _, sys := range systems {
		progress("replicas: load: %d Python contexts on %s", o.loadKernels, sys.name)
		l, err := b.setupSpreadLoad(sctx, sys.servers)
		defer l.close()
		if err != nil {
			return err
		}
		phases = append(phases, l.phase(sys.name, o.loadCount))
	}
	if err := runLoadRounds(sctx, "replicas: load", "runs", phases, o.loadRounds); err != nil {
		return err
	}
	spread, one, bb := phases[0].res, phases[1].res, phases[2].res
	cell := func(r *loadResult) string {
		return fmt.Sprintf("%.0f runs/s, %d errors of %d; p50 / p99 %s / %s ms; gateways' CPU %.2f s per 1 000 runs",
			r.rate(), r.errs, r.total, fmtMS(r.lat.p50()), fmtMS(r.lat.p99()), r.cpu.Seconds()/float64(r.total)*1000) + missingNote(r.missing)
	}
	b.add(row{figure: b.replicaLoadFigure(), kg: cell(spread),
		ratios: fmt.Sprintf("3 replicas / one gateway on PostgreSQL %s; / one on bbolt %s", ratio(spread.rate(), one.rate()), ratio(spread.rate(), bb.rate()))})
	b.add(row{figure: "runs/s, the same load on one gateway on PostgreSQL (--state-url)", kg: cell(one),
		ratios: "PostgreSQL/bbolt " + ratio(one.rate(), bb.rate())})
	b.add(row{figure: "runs/s, the same load on one gateway on bbolt (the default store)", kg: cell(bb)})
	return nil
}

// benchFailover runs opt.failovers trials on rs: a context created
// through a replica, which owns it, gets x; the owner is SIGKILLed and
// another replica is asked for x every failoverPoll until one answer
// has it; the killed replica is replaced by a new one before the next
// trial.
func (b *bench) benchFailover(ctx context.Context, rs *replicaSet) error {
	var took sample
	failed := 0
	for trial := range b.opt.failovers {
		owner := rs.live[trial%len(rs.live)]
		survivor := rs.live[(trial+1)%len(rs.live)]
		id, err := ownedContext(ctx, owner)
		if err != nil {
			return err
		}
		want := fmt.Sprint(4100 + trial)
		ectx, cancel := within(ctx, time.Minute)
		_, err = owner.execute(ectx, map[string]any{"context": id, "code": "x = " + want}, "")
		cancel()
		if err != nil {
			return err
		}
		t0 := time.Now()
		rs.kill(owner)
		d, err := firstAnswer(ctx, survivor, map[string]any{"context": id, "code": "x"}, want, t0, failoverLease+30*time.Second)
		if err != nil {
			failed++
			progress("replicas: failover trial %d: %v", trial+1, err)
		} else {
			took = append(took, d)
			progress("replicas: failover trial %d/%d: %v", trial+1, b.opt.failovers, d.Round(time.Millisecond))
			dctx, cancel := within(ctx, time.Minute)
			err = survivor.deleteContext(dctx, id)
			cancel()
			if err != nil {
				return err
			}
		}
		if _, err := rs.start(ctx); err != nil {
			return err
		}
		if err := rs.waitLive(ctx); err != nil {
			return err
		}
	}
	n := b.opt.failovers
	ratios := fmt.Sprintf("--lease %v; p50 − lease %s ms", failoverLease, fmtMS(took.p50()-failoverLease))
	if failed > 0 {
		ratios += fmt.Sprintf("; %d of %d trials had no answer with the state within the lease + 30 s", failed, n)
	}
	b.add(row{figure: failoverFigure, kg: lat(took), ratios: ratios})
	b.check(fmt.Sprintf("a SIGKILLed owner's context answers through another replica with its state within the lease plus 2 s (p90; --lease %v)", failoverLease),
		failed == 0 && took.p90() <= failoverLease+2*time.Second,
		"p50 %s, p90 %s ms; %d of %d trials answered", fmtMS(took.p50()), fmtMS(took.p90()), len(took), n)
	return nil
}

// firstAnswer sends body as POST /api/execute to s every failoverPoll,
// each request bounded by failoverRequest and several in flight at once,
// until an answer's result is want, and returns the time from t0 to
// that answer.
func firstAnswer(ctx context.Context, s *server, body map[string]any, want string, t0 time.Time, limit time.Duration) (time.Duration, error) {
	pctx, cancel := within(ctx, limit)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	got := make(chan time.Duration, 1)
	var mu sync.Mutex
	var last error
	inflight := make(chan struct{}, 16)
	tick := time.NewTicker(failoverPoll)
	defer tick.Stop()
	for {
		select {
		case d := <-got:
			return d, nil
		case <-pctx.Done():
			mu.Lock()
			err := last
			mu.Unlock()
			return 0, fmt.Errorf("%s: no answer with the context's state within %v; the last: %v", s.name, limit, err)
		case <-tick.C:
		}
		select {
		case inflight <- struct{}{}:
		default:
			continue // as many requests in flight as allowed
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-inflight }()
			rctx, cancel := within(pctx, failoverRequest)
			defer cancel()
			status, out, err := s.do(rctx, "POST", "api/execute", body)
			at := time.Since(t0)
			if err == nil {
				var missing bool
				if missing, err = checkExecution(status, out, want); missing {
					err = errors.New("no result")
				}
			}
			if err != nil {
				mu.Lock()
				last = err
				mu.Unlock()
				return
			}
			select {
			case got <- at:
			default:
			}
		}()
	}
}

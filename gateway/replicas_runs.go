package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"kernelgate/runs"
	"kernelgate/sessions"
)

// This file is how a run accepted here for a context another replica
// owns is forwarded without being lost or run twice (POST /api/execute,
// waited or streamed; POST /api/contexts/{id}/commands, waited, streamed
// or in the background):
//
//  1. This replica gives the run its id and records it in the store,
//     queued (Leases.RecordRun), as it forwards it: the record is
//     committed before this replica answers the client, drops the
//     record, or asks any other replica for the run (runRelay.record).
//     The owner takes that id (the signed principal carries it) and runs
//     it under it, or answers the run it knows by that id already. The
//     owner is the owner cache's when it has one (replicas_cache.go).
//  2. While the owner has not answered in full, this replica watches the
//     kernel's lease (every lease/3). When the connection fails, the
//     owner answers that it does not own the context, or the lease lapses
//     or moves (the owner died or froze), it asks whichever replica holds
//     the lease next for the same run, again under its id: the new owner
//     took the run over from the store (sent it if it was never sent,
//     followed it if it was) and answers it: the Execution, or the events
//     after the last one relayed (no event twice), or the 202.
//  3. The client gets an error only when no replica answers within the
//     run's timeout plus three leases and 30 s (503 UNAVAILABLE,
//     Retry-After), or one of its own making from the owner.

// Leases is what forwarding needs of the store beyond Owners: who holds
// a kernel's lease, to watch the owner while a forward waits, and the
// record of a run forwarded. Owners that implement it get runs forwarded
// as above and other forwards retried on the new owner (replicas_retry.go).
type Leases interface {
	// Holder is the lease of the kernel kind id belongs to, as the store
	// says now.
	Holder(ctx context.Context, kind Kind, id string) (Holding, error)
	// Lease is how long a lease lives without renewal.
	Lease() time.Duration
	// RecordRun commits the record of a run this replica accepted for
	// run.Context, queued, under id, as its owner would write it, unless
	// the run has a record already (its owner's, newer); an error
	// wrapping sessions.ErrNoSuchContext when the context has none.
	RecordRun(ctx context.Context, id string, run ForwardedRun) error
	// DropRun deletes that record while it is still queued and unsent:
	// the owner refused the run (no replica is to send it).
	DropRun(ctx context.Context, id string) error
}

// Holding is who holds a kernel's lease.
type Holding struct {
	Held   bool   // a replica holds it
	Local  bool   // this replica does
	URL    string // the holder's advertised URL
	Kernel string
	Epoch  int64
}

// ForwardedRun is a run accepted here for another replica's context.
type ForwardedRun struct {
	Context  string
	Code     string // the code, or a command's text
	Command  bool
	Stdin    bool
	Timeout  time.Duration
	Accepted time.Time
}

// forwardedRunKey holds the sessions.Forwarded of a forwarded run;
// resumeAfterKey the seq of the last event the client has of it.
const (
	forwardedRunKey = "kernelgate.forwardedRun"
	resumeAfterKey  = "kernelgate.resumeAfter"
)

func forwardedRunOf(c echo.Context) sessions.Forwarded {
	f, _ := c.Get(forwardedRunKey).(sessions.Forwarded)
	return f
}

func resumeAfter(c echo.Context) int {
	n, _ := c.Get(resumeAfterKey).(int)
	return n
}

// notOwnerOfRun is the owner's answer to a forwarded run it let go (its
// lease lost): the forwarding replica asks the new owner.
func notOwnerOfRun(c echo.Context, run *runs.Run) error {
	c.Response().Header().Set("Retry-After", "1")
	return newError(http.StatusServiceUnavailable, "NOT_OWNER",
		"this replica lost the lease of run "+run.ID+"'s kernel: the replica that owns it now has the run")
}

// runRoute says whether c's route starts a run that is forwarded as a
// run (recorded first, followed to whichever replica owns it).
func runRoute(c echo.Context) bool {
	return c.Path() == "/api/execute" || strings.HasSuffix(c.Path(), "/commands")
}

// runRequest is what a run route's body says, as forwarding needs it.
type runRequest struct {
	run        ForwardedRun
	format     streamFormat
	background bool
}

// parseRunRequest reads a run route's body; false when it is not one to
// record (malformed, or refused anyway: the owner says why).
func parseRunRequest(c echo.Context, body []byte) (runRequest, bool) {
	var rr runRequest
	rr.format = wantStream(c.Request())
	if c.Path() == "/api/execute" {
		var b executeBody
		if json.Unmarshal(body, &b) != nil || b.Code == nil || b.Isolated || b.Env != nil {
			return rr, false
		}
		switch b.Kind {
		case "", "code":
		case "exec":
			if *b.Code == "" {
				return rr, false
			}
			rr.run.Command = true
		default:
			return rr, false
		}
		t, err := timeoutBody(b.Timeout)
		if err != nil || (b.Stdin && rr.format == noStream) {
			return rr, false
		}
		rr.run.Code, rr.run.Timeout, rr.run.Stdin = *b.Code, t, b.Stdin
		return rr, true
	}
	var b commandBody
	if json.Unmarshal(body, &b) != nil {
		return rr, false
	}
	argv, err := commandArgv(b.Cmd)
	if err != nil {
		return rr, false
	}
	t, err := timeoutBody(b.Timeout)
	if err != nil || (b.Stdin && rr.format == noStream && !b.Background) {
		return rr, false
	}
	text := strings.Join(argv, " ")
	if len(argv) == 3 && argv[0] == "/bin/sh" && argv[1] == "-c" {
		text = argv[2]
	}
	rr.run = ForwardedRun{Code: text, Command: true, Stdin: b.Stdin, Timeout: t}
	rr.background = b.Background
	if rr.background {
		rr.format = noStream
	}
	return rr, true
}

// recoverFor is how long, past a run's timeout, a forwarded run's client
// waits for some replica to answer for it after its owner was lost.
func recoverFor(lease time.Duration) time.Duration { return 3*lease + 30*time.Second }

// forwardRun forwards a run route's request for kind id to the replica
// holding its lease, recording the run on the way (see the top of this
// file); cached: target is the owner cache's. It answers the client
// itself.
func (s *Server) forwardRun(c echo.Context, kind Kind, id string, target *url.URL, cached bool) (done bool, err error) {
	r := c.Request()
	body, err := io.ReadAll(io.LimitReader(r.Body, s.cfg.MaxBodyBytes+1))
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
	if err != nil || int64(len(body)) > s.cfg.MaxBodyBytes {
		return s.forwardRetrying(c, kind, id, target)
	}
	rr, ok := parseRunRequest(c, body)
	if !ok || kind != KindContext {
		if cached {
			// Forwarded as any request, whose answer is relayed as it
			// comes: to the owner the store names now, not the cache's.
			h, ok := s.ownerNow(r.Context(), kind, id)
			if !ok {
				c.Response().Header().Set("Retry-After", "1")
				return true, newError(http.StatusServiceUnavailable, "UNAVAILABLE", "finding the replica that owns "+string(kind)+" "+id+": the store did not answer")
			}
			if h.Local {
				return false, nil
			}
			if target, err = url.Parse(h.URL); err != nil || target.Host == "" {
				return true, newError(http.StatusServiceUnavailable, "UNAVAILABLE", "the replica that owns "+string(kind)+" "+id+" advertises no usable URL")
			}
		}
		return s.forwardRetrying(c, kind, id, target)
	}
	// The owner Owners named; its epoch is read by its watch.
	holding := Holding{Held: true, URL: target.Scheme + "://" + target.Host}
	rr.run.Context, rr.run.Accepted = id, time.Now()
	rl := &runRelay{s: s, c: c, kind: kind, id: id, body: body, req: rr, runID: runs.NewID(), cached: cached}
	// The record is written while the run travels to its owner, and
	// awaited before this replica relies on it (rl.record): before it
	// answers the client, drops the record, or asks another owner.
	rl.recording = make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), recordTimeout)
		defer cancel()
		rl.recording <- s.leases.RecordRun(ctx, rl.runID, rr.run)
	}()
	defer rl.record() // the write ends before the request does
	return true, rl.follow(holding)
}

// recordTimeout bounds the write of a forwarded run's record.
const recordTimeout = 10 * time.Second

// runRelay is one forwarded run as this replica follows it for its
// client, from owner to owner.
type runRelay struct {
	s     *Server
	c     echo.Context
	kind  Kind
	id    string
	body  []byte
	req   runRequest
	runID string

	// recording gives the outcome of the write of the run's record,
	// begun as the run is first sent (RecordRun); recorded is it, once
	// read (record).
	recording  chan error
	recordDone bool
	recorded   error
	// cached: the first owner asked is the owner cache's.
	cached bool

	last       int       // seq of the last event relayed
	started    bool      // the client's answer has begun (a stream's header)
	recovering bool      // the first owner was lost: some answers mean "not yet"
	streamed   time.Time // when an owner last began streaming the run
}

// outcome is how one attempt at an owner went.
type outcome int

const (
	answered outcome = iota // the client has its answer (or went away)
	lost                    // the owner was lost: ask the next one
)

// follow asks the owner in h for the run, and the next owners while
// they are lost, until one answers or the time to recover is over.
func (rl *runRelay) follow(h Holding) error {
	ctx := rl.c.Request().Context()
	lease := rl.s.leases.Lease()
	var until, lostAt time.Time
	for {
		var o outcome
		var err error
		if h.Local {
			if h.Held {
				// Taken over here: the run is answered once the
				// take-over has restored the context (a stream begun
				// cannot be answered "not yet").
				rl.s.awaitKnown(ctx, rl.kind, rl.id, until)
			}
			o, err = rl.local()
		} else {
			o, err = rl.remote(h)
		}
		if o == answered || ctx.Err() != nil {
			return err
		}
		// The run is asked of no other owner before its record is
		// committed: a replica asked for it by its id after the owner
		// was lost (or after a stale owner refused it) may hand its id
		// out at once.
		if err := rl.record(); err != nil {
			return rl.unrecorded(err)
		}
		rl.s.holders.forget(rl.kind, rl.id)
		if rl.cached && !rl.recovering && !rl.started {
			// The owner the cache named did not take the run: it
			// lost the lease or died since. The store is asked at
			// once, as for a request this replica had not seen.
			rl.cached = false
			if next, ok := rl.s.ownerNow(ctx, rl.kind, rl.id); ok {
				h = next
				continue
			}
		}
		if !rl.recovering {
			rl.recovering = true
			rl.s.log.Warn("replicas: the owner of a forwarded run was lost; asking the next owner", "run", rl.runID, "context", rl.id, "owner", h.URL)
		}
		// The time to recover counts from the first loss, and again
		// from a loss after an owner streamed the run (a long run
		// followed from owner to owner).
		if until.IsZero() || rl.streamed.After(lostAt) {
			lostAt = time.Now()
			until = lostAt.Add(recoverFor(lease))
			if t := rl.req.run.Timeout; t > 0 {
				if d := rl.req.run.Accepted.Add(t + recoverFor(lease)); d.After(until) {
					until = d
				}
			}
		}
		next, ok := rl.s.awaitHolder(ctx, rl.kind, rl.id, until)
		if !ok {
			if ctx.Err() != nil {
				return nil
			}
			return rl.unavailable()
		}
		if next.Held && !next.Local {
			rl.s.holders.put(rl.kind, rl.id, next.URL, time.Now().Add(lease/3))
		}
		h = next
	}
}

// ownerNow asks Owners who owns kind id now (taking it over here when
// it is free or was handed here), and keeps the answer in the owner
// cache; false when the store did not answer.
func (s *Server) ownerNow(ctx context.Context, kind Kind, id string) (Holding, bool) {
	asked := time.Now()
	owner, local, err := s.owners.Owner(ctx, kind, id)
	switch {
	case err != nil:
		return Holding{}, false
	case local:
		return Holding{Local: true}, true
	}
	s.holders.put(kind, id, owner, asked.Add(s.leases.Lease()/3))
	return Holding{Held: true, URL: owner}, true
}

// record waits for the write of the run's record and returns how it
// went; a write that failed for want of the store is tried once more
// (it changes nothing when the record is there).
func (rl *runRelay) record() error {
	if rl.recordDone {
		return rl.recorded
	}
	err := <-rl.recording
	if err != nil && classify(err).status == http.StatusInternalServerError {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(rl.c.Request().Context()), recordTimeout)
		err = rl.s.leases.RecordRun(ctx, rl.runID, rl.req.run)
		cancel()
	}
	rl.recordDone, rl.recorded = true, err
	return err
}

// unrecorded answers the client when the run's record could not be
// written: its context has no record (deleted), or the store does not
// answer.
func (rl *runRelay) unrecorded(err error) error {
	rl.s.log.Error("replicas: the record of a forwarded run was not written", "run", rl.runID, "context", rl.id, "err", err)
	if rl.started {
		return nil // a stream ends without its end
	}
	if ae := classify(err); ae.status != http.StatusInternalServerError {
		return ae
	}
	rl.c.Response().Header().Set("Retry-After", "1")
	rl.c.Response().Header().Set("X-Run-Id", rl.runID)
	return newError(http.StatusServiceUnavailable, "UNAVAILABLE",
		"recording run "+rl.runID+" of context "+rl.id+" failed: "+err.Error()+"; read it later at /api/runs/"+rl.runID)
}

// unavailable answers the client once no replica answered in time.
func (rl *runRelay) unavailable() error {
	rl.s.log.Error("replicas: no replica answered for a forwarded run in time", "run", rl.runID, "context", rl.id)
	if rl.started {
		return nil // a stream ends without its end: the client resumes with ?after=N
	}
	rl.c.Response().Header().Set("Retry-After", "1")
	rl.c.Response().Header().Set("X-Run-Id", rl.runID)
	return newError(http.StatusServiceUnavailable, "UNAVAILABLE",
		"no replica answered for run "+rl.runID+" of context "+rl.id+" in time: read it later at /api/runs/"+rl.runID)
}

// local answers the run here: this replica holds the lease now (it took
// the kernel over).
func (rl *runRelay) local() (outcome, error) {
	if err := rl.record(); err != nil {
		return answered, rl.unrecorded(err)
	}
	c := rl.c
	c.Request().Body = io.NopCloser(bytes.NewReader(rl.body))
	c.Set(forwardedRunKey, sessions.Forwarded{ID: rl.runID, Accepted: rl.req.run.Accepted})
	c.Set(resumeAfterKey, rl.last)
	var err error
	if c.Path() == "/api/execute" {
		err = rl.s.execute(c)
	} else {
		err = rl.s.runCommand(c)
	}
	if err != nil && !c.Response().Committed && rl.retryable(classify(err)) {
		return lost, nil
	}
	return answered, err
}

// retryable says whether an owner's error answer means the run is to be
// asked of the next owner.
func (rl *runRelay) retryable(ae *apiError) bool {
	switch {
	case ae.status == http.StatusServiceUnavailable && (ae.code == "NOT_OWNER" || ae.code == "UNAVAILABLE"):
		return true
	case rl.recovering && ae.status == http.StatusNotFound:
		// The new owner is still taking the context over.
		return true
	}
	return false
}

// remote asks the owner in h for the run, watching its lease meanwhile.
func (rl *runRelay) remote(h Holding) (outcome, error) {
	target, err := url.Parse(h.URL)
	if err != nil || target.Host == "" {
		return lost, nil
	}
	c := rl.c
	ctx, cancel := context.WithCancel(c.Request().Context())
	defer cancel()
	stop := rl.s.watchOwner(ctx, cancel, rl.kind, rl.id, h)
	defer stop()
	p, _ := c.Get(principalKey).(principal)
	resp, err := rl.s.proxy.Send(ctx, target, c.Request(), rl.body, encodeRunPrincipal(p, rl.runID, rl.req.run.Accepted))
	if err != nil {
		return lost, nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
		js, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return lost, nil
		}
		var e struct{ Code, Message string }
		json.Unmarshal(js, &e)
		if rl.retryable(&apiError{status: resp.StatusCode, code: e.Code}) {
			return lost, nil
		}
		if rl.started {
			return answered, nil
		}
		// Refused: no replica is to send it later. Its record, once
		// written, is deleted (the owner's answer is relayed whether
		// or not it was written).
		if rl.record() == nil {
			if err := rl.s.leases.DropRun(context.WithoutCancel(ctx), rl.runID); err != nil {
				rl.s.log.Warn("replicas: the record of a run its owner refused was not deleted", "run", rl.runID, "err", err)
			}
		}
		return answered, rl.relayAll(resp, js)
	}
	if rl.req.format != noStream && resp.StatusCode == http.StatusOK {
		// The run's id leaves with the stream's start: its record is
		// committed first.
		if !rl.started {
			if err := rl.record(); err != nil {
				return answered, rl.unrecorded(err)
			}
		}
		return rl.relayStream(resp)
	}
	// A waited run's Execution (or a background run's id) comes whole,
	// at its end: read whole before anything is written, so that an
	// owner lost while writing it is asked again.
	js, err := io.ReadAll(resp.Body)
	if err != nil {
		return lost, nil
	}
	if err := rl.record(); err != nil && resp.StatusCode != http.StatusOK {
		// A background run's id is not handed out unrecorded. A
		// waited run's Execution is: the owner committed its own
		// record before sending the code.
		return answered, rl.unrecorded(err)
	}
	return answered, rl.relayAll(resp, js)
}

// relayAll writes an owner's whole answer.
func (rl *runRelay) relayAll(resp *http.Response, js []byte) error {
	h := rl.c.Response().Header()
	for _, k := range []string{"Content-Type", "X-Run-Id", "Retry-After"} {
		if v := resp.Header.Get(k); v != "" {
			h.Set(k, v)
		}
	}
	h.Set("Content-Length", strconv.Itoa(len(js)))
	rl.c.Response().WriteHeader(resp.StatusCode)
	rl.c.Response().Write(js)
	return nil
}

// relayStream relays a run's events from an owner, each flushed as it
// comes, skipping those the client has (an owner asked again streams
// the run from its start), until the run's end.
func (rl *runRelay) relayStream(resp *http.Response) (outcome, error) {
	w := rl.c.Response()
	if !rl.started {
		for _, k := range []string{"Content-Type", "Cache-Control", "X-Accel-Buffering", "X-Run-Id"} {
			if v := resp.Header.Get(k); v != "" {
				w.Header().Set(k, v)
			}
		}
		w.WriteHeader(http.StatusOK)
		w.Flush()
		rl.started = true
	}
	rl.streamed = time.Now()
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		ev, err := readEvent(br, rl.req.format)
		if err != nil {
			return lost, nil
		}
		seq, typ := eventSeq(ev, rl.req.format)
		if seq <= rl.last && !(typ == "keepalive" && seq == rl.last) {
			continue
		}
		if _, err := w.Write(ev); err != nil {
			return answered, nil
		}
		w.Flush()
		if seq > rl.last {
			rl.last = seq
		}
		if typ == "end" {
			return answered, nil
		}
	}
}

// readEvent reads one event of a stream: an NDJSON line, or an SSE block
// up to its blank line; with its terminator.
func readEvent(br *bufio.Reader, format streamFormat) ([]byte, error) {
	if format != sse {
		return br.ReadBytes('\n')
	}
	var ev []byte
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		ev = append(ev, line...)
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			if len(bytes.TrimSpace(ev)) == 0 {
				ev = ev[:0]
				continue
			}
			return ev, nil
		}
	}
}

// eventSeq reads an event's seq and type.
func eventSeq(ev []byte, format streamFormat) (int, string) {
	js := ev
	if format == sse {
		js = nil
		for _, line := range bytes.Split(ev, []byte("\n")) {
			if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
				js = bytes.TrimSpace(d)
			}
		}
	}
	var e struct {
		Seq  int    `json:"seq"`
		Type string `json:"type"`
	}
	json.Unmarshal(js, &e)
	return e.Seq, e.Type
}

// watchOwner cancels a forward (cancel) when the lease of kind id is no
// longer h's (lapsed, taken by another replica, or this one's), looking
// every lease/3 until stop is called or ctx ends. An h without its epoch
// (0) takes the one the first look finds held by h.URL: a forward
// answered within lease/3 costs no look.
func (s *Server) watchOwner(ctx context.Context, cancel context.CancelFunc, kind Kind, id string, h Holding) (stop func()) {
	every := s.leases.Lease() / 3
	if every <= 0 || !h.Held {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			now, err := s.leases.Holder(ctx, kind, id)
			if err != nil {
				continue // the store did not answer: look again
			}
			same := sameReplica(now.URL, h.URL)
			if h.Epoch == 0 && same {
				h.Epoch = now.Epoch
			}
			if !now.Held || now.Local || !same || now.Epoch != h.Epoch {
				s.log.Warn("replicas: the owner's lease lapsed or moved while a forward waited on it; asking the next owner", "owner", h.URL, string(kind), id)
				cancel()
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
	}
}

// sameReplica says whether two advertised URLs name one replica.
func sameReplica(a, b string) bool {
	ua, errA := url.Parse(a)
	ub, errB := url.Parse(b)
	if errA != nil || errB != nil {
		return a == b
	}
	return strings.EqualFold(ua.Scheme, ub.Scheme) && strings.EqualFold(ua.Host, ub.Host)
}

// awaitHolder waits, looking a few times a lease, until a replica holds
// the lease of kind id, and returns it; false when until passed (or ctx
// ended) first. A lease no replica takes within a whole lease is
// answered here (Local), as Owners answers what no replica holds.
func (s *Server) awaitHolder(ctx context.Context, kind Kind, id string, until time.Time) (Holding, bool) {
	lease := s.leases.Lease()
	every := min(max(lease/6, 100*time.Millisecond), time.Second)
	var freeSince time.Time
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		// Never at once: the owner just lost is given a moment.
		select {
		case <-ctx.Done():
			return Holding{}, false
		case <-t.C:
		}
		if time.Now().After(until) {
			return Holding{}, false
		}
		h, err := s.leases.Holder(ctx, kind, id)
		switch {
		case err != nil:
		case h.Held:
			return h, true
		case freeSince.IsZero():
			freeSince = time.Now()
		case time.Since(freeSince) > lease:
			return Holding{Local: true}, true
		}
	}
}

// encodeRunPrincipal is the principal of a forwarded run: p, with the
// run's id and when it was accepted.
func encodeRunPrincipal(p principal, run string, accepted time.Time) []byte {
	b, _ := json.Marshal(wirePrincipal{Name: p.name, Scopes: p.scopes, Context: p.context, ContextCreated: p.contextCreated,
		Run: run, Accepted: accepted})
	return b
}

// decodeForwardedRun is the run a forwarded request's principal carries.
func decodeForwardedRun(b []byte) sessions.Forwarded {
	var w wirePrincipal
	if json.Unmarshal(b, &w) != nil || w.Run == "" {
		return sessions.Forwarded{}
	}
	return sessions.Forwarded{ID: w.Run, Accepted: w.Accepted}
}

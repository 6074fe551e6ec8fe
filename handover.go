package main

import (
	"context"
	"log/slog"
	"time"

	"kernelgate/gateway"
	"kernelgate/sessions"
	"kernelgate/state"
)

// handoverStop bounds what a handover takes after its drain: moving the
// leases and telling the new owners.
const handoverStop = 20 * time.Second

// handOver hands a stopping replica's kernels over to the other live
// replicas (docs/replicas.md): /readyz answers 503 from now on, requests
// go on being served, each kernel's runs finish within grace, then its
// lease goes to another replica, which takes it over at once. With no
// other live replica the kernels stay, to be shut down as a single
// gateway's are.
func handOver(mgr *sessions.Manager, srv *gateway.Server, grace time.Duration, log *slog.Logger) {
	t0 := time.Now()
	log.Info("handing the kernels over to the other replicas", "drain", grace)
	rep := mgr.HandOver(context.Background(), grace, srv.AskToAdopt)
	if rep.Peers == 0 {
		log.Info("no other replica serves: the kernels are shut down as a single gateway's")
		return
	}
	log.Info("kernels handed over", "handed", rep.Handed, "kept", rep.Kept,
		"unfinished_runs", rep.Unfinished, "replicas", rep.Peers, "took", time.Since(t0).Round(time.Millisecond))
}

// othersKernels are, for a replica, the kernels with a record in the
// store: another replica owns them or will take them over, so the sweep
// of what earlier processes left in the runtime directory leaves their
// processes alone (a kernel this directory's earlier process handed over
// runs on). None for a single gateway.
func othersKernels(store *state.Postgres, log *slog.Logger) []string {
	if store == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids, err := store.RecordedKernels(ctx)
	if err != nil {
		log.Warn("the kernels the store records could not be listed: the sweep of what earlier processes left may stop another replica's kernels", "err", err)
	}
	return ids
}

package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kernelgate/state"
)

// Environment that makes the test binary a replica process (replicaMain)
// for the tests with real processes.
const (
	replicaEnv      = "KERNELGATE_CLUSTER_REPLICA" // its id
	replicaURLEnv   = "KERNELGATE_CLUSTER_STATE_URL"
	replicaLeaseEnv = "KERNELGATE_CLUSTER_LEASE"
)

func TestMain(m *testing.M) {
	if id := os.Getenv(replicaEnv); id != "" {
		lease, _ := time.ParseDuration(os.Getenv(replicaLeaseEnv))
		os.Exit(replicaMain(id, os.Getenv(replicaURLEnv), lease))
	}
	os.Exit(m.Run())
}

// replicaMain is a replica: a member with a lease keeper on the store at
// url, driven by commands on stdin, one a line, answering on stdout:
//
//	acquire K…        acquires each kernel at once: "acquired K EPOCH",
//	                  "held K OWNER" or "error K …", a line each
//	write K EPOCH S   writes kernel K (spec S) under the fence K@EPOCH:
//	                  "wrote K EPOCH", "fenced K EPOCH" or "error K …"
//	quit (or EOF)     stops cleanly (keeper, member row, store): "bye"
//
// and "lost K EPOCH" whenever its keeper reports a lease lost.
func replicaMain(id, url string, lease time.Duration) int {
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	ctx := context.Background()
	store, err := state.OpenPostgres(ctx, url, state.PostgresOptions{Replica: id})
	if err != nil {
		say("error open %v", err)
		return 2
	}
	cfg := Config{URL: "http://" + id + ".test", Lease: lease}
	member, err := Join(ctx, store, cfg)
	if err != nil {
		say("error join %v", err)
		return 2
	}
	keeper, err := NewKeeper(store, cfg, func(lost []state.Fence) {
		for _, f := range lost {
			say("lost %s %d", f.Kernel, f.Epoch)
		}
	})
	if err != nil {
		say("error keeper %v", err)
		return 2
	}
	say("ready %s", id)
	in := bufio.NewScanner(os.Stdin)
commands:
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch {
		case f[0] == "acquire":
			var wg sync.WaitGroup
			for _, k := range f[1:] {
				wg.Go(func() {
					l, err := keeper.Acquire(ctx, k)
					switch {
					case err == nil:
						say("acquired %s %d", k, l.Epoch)
					case l.Owner != "":
						say("held %s %s", k, l.Owner)
					default:
						say("error %s %v", k, err)
					}
				})
			}
			wg.Wait()
		case f[0] == "write" && len(f) == 4:
			epoch, _ := strconv.ParseInt(f[2], 10, 64)
			err := state.Fenced(store, state.Fence{Kernel: f[1], Epoch: epoch}).PutKernel(ctx, state.Kernel{ID: f[1], Spec: f[3]})
			switch {
			case err == nil:
				say("wrote %s %d", f[1], epoch)
			case errors.Is(err, state.ErrFenced):
				say("fenced %s %d", f[1], epoch)
			default:
				say("error %s %v", f[1], err)
			}
		case f[0] == "quit":
			break commands
		default:
			say("error unknown command %q", in.Text())
		}
	}
	keeper.Close()
	member.Close(ctx)
	store.Close()
	say("bye")
	return 0
}

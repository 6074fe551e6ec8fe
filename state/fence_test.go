package state

import (
	"context"
	"reflect"
	"testing"
)

// TestFencedOneGateway: a store of one gateway (memory, bolt, PostgreSQL
// without a replica) has no leases: writes made under any fence go in,
// as the same writes made without one.
func TestFencedOneGateway(t *testing.T) {
	for _, f := range storeFactories() {
		if f.name == "postgres-replica" {
			continue
		}
		t.Run(f.name, func(t *testing.T) {
			ctx := context.Background()
			s := f.open(t)
			defer s.Close()
			w := Fenced(s, Fence{Kernel: "k1", Epoch: 7})
			must(t, w.PutKernel(ctx, sampleKernel("k1")))
			must(t, w.PutContext(ctx, sampleContext("c1")))
			must(t, w.PutRun("r1", []byte("queued")))
			must(t, w.AppendRunEvents("r1", Event{1, []byte("e1")}))
			must(t, w.CommitRun(ctx, "r2", []byte("committed")))
			done := make(chan error, 1)
			must(t, w.CommitRunAsync("r3", []byte("async"), func(err error) { done <- err }))
			must(t, <-done)
			must(t, w.Flush(ctx))
			snap, err := s.Load(ctx)
			must(t, err)
			want := &Snapshot{
				Kernels:  []Kernel{sampleKernel("k1")},
				Contexts: []Context{sampleContext("c1")},
				Runs: []Run{{ID: "r1", Data: []byte("queued"), Events: []Event{{1, []byte("e1")}}},
					{ID: "r2", Data: []byte("committed")}, {ID: "r3", Data: []byte("async")}},
			}
			if !reflect.DeepEqual(snap, want) {
				t.Errorf("loaded\n%+v\nwant\n%+v", snap, want)
			}
		})
	}
}

package state

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkPutKernelSynced is the latency of one durable write (one
// commit and fsync when writes come one at a time).
func BenchmarkPutKernelSynced(b *testing.B) {
	s := openBolt(b, filepath.Join(b.TempDir(), FileName), nil)
	defer s.Close()
	ctx := context.Background()
	k := sampleKernel("")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k.ID = fmt.Sprint("k", i)
		if err := s.PutKernel(ctx, k); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDeleteKernelSynced is the latency of one durable delete.
func BenchmarkDeleteKernelSynced(b *testing.B) {
	s := openBolt(b, filepath.Join(b.TempDir(), FileName), nil)
	defer s.Close()
	ctx := context.Background()
	k := sampleKernel("")
	for i := 0; i < b.N; i++ {
		k.ID = fmt.Sprint("k", i)
		s.PutKernel(ctx, k)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.DeleteKernel(ctx, fmt.Sprint("k", i)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRunRecords is the throughput of run writes: each run puts its
// data twice (start, end) and 8 events of 200 bytes, from 8 goroutines,
// as runs finishing at once would. It reports runs/s and the share of
// runs whose writes held their caller over 1ms (they queue, and never
// wait: past MaxQueued bytes waiting for the disk they are refused).
func BenchmarkRunRecords(b *testing.B) {
	s := openBolt(b, filepath.Join(b.TempDir(), FileName), nil)
	defer s.Close()
	data := make([]byte, 2000)
	ev := make([]byte, 200)
	var n, slow atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := fmt.Sprint("r", n.Add(1))
			t := time.Now()
			s.PutRun(id, data)
			for seq := uint64(1); seq <= 8; seq++ {
				s.AppendRunEvents(id, Event{seq, ev})
			}
			s.PutRun(id, data)
			if time.Since(t) > time.Millisecond {
				slow.Add(1)
			}
		}
	})
	if err := s.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
	el := time.Since(start)
	b.ReportMetric(float64(n.Load())/el.Seconds(), "runs/s")
	b.ReportMetric(100*float64(slow.Load())/float64(n.Load()), "%calls>1ms")
}

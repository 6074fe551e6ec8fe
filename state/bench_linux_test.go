package state

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
)

// BenchmarkRunCommits is the CPU a commit of run writes costs per run in
// a steady state: 1000 runs kept, each commit holding 8 runs (at about
// 400 runs a second, what DefaultFlushDelay gathers), each put three
// times (queued, running, done) with three events, and pruning the 8
// oldest. Random keys (UUID version 4) dirty a page of each tree per run;
// time-ordered keys (version 7, the run ids) keep the changes at the two
// ends of the trees.
func BenchmarkRunCommits(b *testing.B) {
	for _, keys := range []struct {
		name string
		id   func() string
	}{
		{"random", uuid.NewString},
		{"time-ordered", func() string { return uuid.Must(uuid.NewV7()).String() }},
	} {
		b.Run("keys="+keys.name, func(b *testing.B) {
			s := openBolt(b, filepath.Join(b.TempDir(), FileName), nil)
			defer s.Close()
			const perCommit = 8
			rec, done, ev := make([]byte, 400), make([]byte, 1400), make([]byte, 150)
			var ids []string
			batch := func() []op {
				var ops []op
				for range perCommit {
					id := keys.id()
					ids = append(ids, id)
					ops = append(ops,
						op{kind: opPutRun, key: id, val: rec},
						op{kind: opEvents, key: id, events: []Event{{1, ev}}},
						op{kind: opPutRun, key: id, val: rec},
						op{kind: opEvents, key: id, events: []Event{{2, ev}}},
						op{kind: opEvents, key: id, events: []Event{{3, ev}}},
						op{kind: opPutRun, key: id, val: done})
					if len(ids) > 1000 {
						ops = append(ops, op{kind: opDeleteRun, key: ids[0]})
						ids = ids[1:]
					}
				}
				return ops
			}
			for range 200 {
				if err := s.commit(batch()); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			c0 := cpuTime()
			for range b.N {
				if err := s.commit(batch()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((cpuTime()-c0).Microseconds())/float64(b.N*perCommit), "cpu-µs/run")
		})
	}
}

// cpuTime is the CPU time the process has used.
func cpuTime() time.Duration {
	var r syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r)
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}

package sessions

import (
	"context"
	"testing"
	"time"

	"kernelgate/internal/leakcheck"
	"kernelgate/jupyter"
)

// A manager's cycle of kernels, runs, clients, holds and pools leaves no
// goroutine behind once it is closed.
func TestManagerCycleLeaksNothing(t *testing.T) {
	before := leakcheck.Snapshot(t)
	for i := 0; i < 3; i++ {
		f := &fakeKernels{script: lateResult, impl: "Deno kernel"}
		m := New(Config{DefaultKernel: "fake", Languages: map[string]string{"python": "fake"}, PoolSize: 1, LateOutputWait: time.Minute}, fakeSpecs(t), nil, nil)
		m.start = f.start
		k, err := m.StartKernel(context.Background(), StartOptions{})
		if err != nil {
			t.Fatal(err)
		}
		clientRequest(t, k, "x")
		// A request whose idle status is still held when the manager closes.
		c, err := k.Attach("held")
		if err != nil {
			t.Fatal(err)
		}
		req, _ := jupyter.NewMessage("held", jupyter.ExecuteRequest, jupyter.NewExecute("nothing"), nil)
		if err := c.Send(context.Background(), Shell, req); err != nil {
			t.Fatal(err)
		}
		run(t, m, ExecuteRequest{Code: "print x"})
		run(t, m, ExecuteRequest{Code: "print y", Isolated: true})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		within(t, "Manager.Close", 15*time.Second, func() { m.Close(ctx) })
		cancel()
	}
	leakcheck.Check(t, before)
}

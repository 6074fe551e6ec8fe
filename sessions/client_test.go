package sessions

import (
	"context"
	"errors"
	"testing"
	"time"

	"kernelgate/jupyter"
)

// A client that stops reading while a request of its own awaits a reply is
// cut with ErrSlowClient, and the kernel, its model and the manager's
// status stay answerable (no lock held across the cut).
func TestSlowClientIsCutWithoutDeadlock(t *testing.T) {
	release, flooded := make(chan struct{}), make(chan struct{})
	f := &fakeKernels{script: func(r *fakeRequest) {
		if r.Msg.Type() != jupyter.ExecuteRequest {
			fakeAnswer(r)
			return
		}
		// Messages a client cannot lose (not output): past twice its
		// limit the client is cut.
		for i := 0; i < 20; i++ {
			r.Status(jupyter.StateBusy)
		}
		close(flooded)
		select {
		case <-release:
		case <-r.k.done:
			return
		}
		r.Reply(map[string]any{"status": "ok"})
		r.Status(jupyter.StateIdle)
	}}
	m := newFakeManager(t, Config{ClientMessages: 8}, f)
	k, err := m.StartKernel(context.Background(), StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slow, err := k.Attach("slow")
	if err != nil {
		t.Fatal(err)
	}
	req, _ := jupyter.NewMessage("slow", jupyter.ExecuteRequest, jupyter.NewExecute("flood"), nil)
	if err := slow.Send(context.Background(), Shell, req); err != nil {
		t.Fatal(err)
	}
	select {
	case <-slow.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the slow client was not cut")
	}
	within(t, "Kernel.Model", 5*time.Second, func() { k.Model() })
	within(t, "Manager.Status", 5*time.Second, func() { m.Status() })
	within(t, "Manager.Kernels", 5*time.Second, func() { m.Kernels() })
	if got := k.Model().Connections; got != 0 {
		t.Errorf("connections after the cut: %d, want 0", got)
	}

	// A client attached after the cut (and the flood, whose rest was kept
	// for the next client) gets the kernel's messages.
	<-flooded
	other, err := k.Attach("other")
	if err != nil {
		t.Fatal(err)
	}
	// The other client reads everything, until it sees the kernel idle.
	sawIdle := make(chan struct{})
	readerDone := make(chan error, 1)
	go func() {
		idle := false
		for {
			items, err := other.Take()
			if err != nil {
				readerDone <- err
				return
			}
			for _, o := range items {
				if !idle && o.Msg.ExecutionState() == jupyter.StateIdle {
					idle = true
					close(sawIdle)
				}
			}
			if len(items) == 0 {
				<-other.Ready()
			}
		}
	}()
	// What was queued stays readable, then the client says why it ended.
	var cutErr error
	within(t, "draining the slow client", 5*time.Second, func() {
		for {
			if _, err := slow.Take(); err != nil {
				cutErr = err
				return
			}
		}
	})
	if !errors.Is(cutErr, ErrSlowClient) {
		t.Errorf("slow client ended with %v, want ErrSlowClient", cutErr)
	}
	// The client that keeps up keeps receiving the kernel's messages.
	close(release)
	select {
	case <-sawIdle:
	case err := <-readerDone:
		t.Fatalf("the reading client ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the reading client never saw the kernel idle")
	}
	other.Close()
	if err := <-readerDone; !errors.Is(err, ErrClientClosed) {
		t.Errorf("reading client ended with %v", err)
	}
}

// The reply of a request whose client left reaches a client of another
// session that attached before the reply came (ZeroMQ may deliver the
// kernel's idle status before its shell reply), as the run's output did.
func TestLateReplyOfGoneClientReachesTheNextClient(t *testing.T) {
	idle, release := make(chan struct{}), make(chan struct{})
	f := &fakeKernels{script: func(r *fakeRequest) {
		if r.Msg.Type() != jupyter.ExecuteRequest {
			fakeAnswer(r)
			return
		}
		r.Status(jupyter.StateBusy)
		r.Stream("out\n")
		r.Status(jupyter.StateIdle)
		close(idle)
		select {
		case <-release:
		case <-r.k.done:
			return
		}
		r.Reply(map[string]any{"status": "ok"})
	}}
	m := newFakeManager(t, Config{}, f)
	k, err := m.StartKernel(context.Background(), StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := k.Attach("first")
	if err != nil {
		t.Fatal(err)
	}
	req, _ := jupyter.NewMessage("first", jupyter.ExecuteRequest, jupyter.NewExecute("run"), nil)
	if err := first.Send(context.Background(), Shell, req); err != nil {
		t.Fatal(err)
	}
	first.Close()
	<-idle
	next, err := k.Attach("next")
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	close(release)
	deadline := time.After(10 * time.Second)
	for {
		items, err := next.Take()
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range items {
			if o.Msg.Type() == jupyter.ExecuteReply && o.Msg.ParentID == req.Header.MsgID {
				return
			}
		}
		select {
		case <-next.Ready():
		case <-deadline:
			t.Fatal("the reply never reached the client attached after the first left")
		}
	}
}

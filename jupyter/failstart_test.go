//go:build linux

package jupyter

import (
	"context"
	"errors"
	"testing"
	"time"

	"kernelgate/internal/testkernels"
)

// TestFailStartSaysTheKernelsDeath: when a start's request fails because
// the kernel died meanwhile (it passed the check for a dead kernel just
// before die closed the sockets, as when a start's nudge and the grace
// after a lost connection end together), the start reports that death:
// a connection lost while the process ran, which a provisioner starts
// again, not the process killed by it.
func TestFailStartSaysTheKernelsDeath(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	k, err := Start(ctx, testProvisioner(t), Config{Spec: testkernels.Spec(t, "python3")})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Shutdown(context.Background())
	k.die(&DiedError{Output: k.proc.Output(), Lost: IOPub.String()})
	err = k.failStart(ctx, errors.New("zmq4: write on a closed connection"))
	var died *DiedError
	if !errors.Is(err, ErrStartFailed) || !errors.As(err, &died) || died.Lost != "iopub" || died.During != "start" {
		t.Fatalf("start failed with %v (%+v), want the kernel's death: its iopub connection lost during the start", err, died)
	}
}

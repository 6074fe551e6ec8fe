//go:build linux

package local

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"kernelgate/internal/testkernels"
	"kernelgate/jupyter"
)

// A kernel kept by a gateway of an earlier version, whose store holds its
// info with the local part under "local" (and no "data"), is adopted
// after an upgrade by the provisioner wired as kernelgate wires it (under
// Name, with InfoName as an alias), with its state.
func TestAdoptInfoOfEarlierVersion(t *testing.T) {
	p := &Provisioner{RuntimeDir: t.TempDir(), Detached: true}
	reg := jupyter.NewRegistry(Name)
	reg.Register(Name, p)
	reg.Alias(InfoName, Name)
	spec := testkernels.Spec(t, "python3")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	k1, err := jupyter.Start(ctx, reg, jupyter.Config{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	if got := resultText(t, k1, "x = 41; x"); got != "41" {
		t.Fatalf("x = %q", got)
	}
	info, err := k1.ProvisionerInfo()
	if err != nil {
		k1.Shutdown(ctx)
		t.Fatal(err)
	}
	// What the earlier version wrote: {"provisioner": "local",
	// "connection": …, "local": {"pid": …, "startTime": …, …}}.
	old, err := json.Marshal(map[string]any{"provisioner": "local", "connection": info.Connection, "local": json.RawMessage(info.Data)})
	if err != nil {
		t.Fatal(err)
	}
	k1.Detach()

	loaded, err := jupyter.UnmarshalProvisionerInfo(old)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := jupyter.Reconnect(ctx, reg, loaded, jupyter.Config{ID: k1.ID(), Spec: spec})
	if err != nil {
		jupyter.Stop(context.Background(), reg, loaded, time.Second)
		t.Fatalf("the kernel kept by the earlier version was not adopted: %v", err)
	}
	defer k2.Shutdown(context.Background())
	if k2.PID() != k1.PID() {
		t.Errorf("adopted pid %d, want %d", k2.PID(), k1.PID())
	}
	if got := resultText(t, k2, "x + 1"); got != "42" {
		t.Fatalf("the adopted kernel lost its state: x + 1 = %q", got)
	}
}

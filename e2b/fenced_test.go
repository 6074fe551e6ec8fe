package e2b

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"kernelgate/cluster"
	"kernelgate/internal/pgtest"
	"kernelgate/internal/testkernels"
	"kernelgate/kernelspecs"
	"kernelgate/provision/local"
	"kernelgate/sessions"
	"kernelgate/state"
	"kernelgate/workspace"
)

// TestSandboxRecordWrittenUnderItsKernelsFence: among replicas a
// sandbox's record is written under the fence of its default context's
// kernel. Once another replica has taken that kernel's lease (this one
// has not noticed yet, as after a pause), a timeout set here is not
// written over the record: the store keeps the sandbox's end as it was.
func TestSandboxRecordWrittenUnderItsKernelsFence(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB("fenced")
	ctx := context.Background()
	store, err := state.OpenPostgres(ctx, url, state.PostgresOptions{Replica: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	rep, err := cluster.Start(store, cluster.Config{URL: "http://a.invalid", Lease: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Leave(ctx)
	testkernels.Spec(t, "python3")
	root, err := workspace.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	runtime := t.TempDir()
	if err := os.Chmod(filepath.Dir(runtime), 0o711); err != nil {
		t.Fatal(err)
	}
	m := sessions.New(sessions.Config{Store: store, Workspaces: root, Ownership: rep},
		kernelspecs.Load([]string{testkernels.Dir(t)}), &local.Provisioner{RuntimeDir: runtime}, nil)
	defer func() {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		m.Close(cctx)
	}()
	h := New(Config{Owned: func(context.Context, string) (bool, error) { return true, nil }}, m)
	u := serve(t, h)

	id, _, _ := create(t, u, `{"timeout": 600}`)
	before, ok := record(t, store, id)
	if !ok {
		t.Fatal("the sandbox has no record")
	}
	c, err := m.Context(contextPrefix(id) + "python")
	if err != nil {
		t.Fatal(err)
	}
	// Another replica takes the kernel's lease (a new term).
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if tag, err := conn.Exec(ctx, `UPDATE leases SET owner = 'b', epoch = epoch + 1, expires_at = now() + interval '1 hour' WHERE kernel_id = $1`, c.KernelID()); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("taking the lease: %v %v", tag, err)
	}

	send(t, "POST", u+"/sandboxes/"+id+"/timeout", `{"timeout": 30}`, apiKey)
	after, ok := record(t, store, id)
	if !ok || !after.Ends.Equal(before.Ends) {
		t.Errorf("the record after a timeout set under a lease taken by another replica: kept %v, ends %v; want %v as before", ok, after.Ends, before.Ends)
	}
}

//go:build linux

package e2b

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"kernelgate/internal/testkernels"
	"kernelgate/kernelspecs"
	"kernelgate/provision/local"
	"kernelgate/sessions"
	"kernelgate/workspace"
)

// A sandbox's info tells the limits its kernels run under: the CPUs the
// gateway may use and the kernel memory limit, or the machine's memory
// without one.
func TestSandboxInfoReportsTheLimits(t *testing.T) {
	testkernels.Spec(t, "python3")
	for _, c := range []struct {
		name   string
		memory int64
	}{{"limited", 768 << 20}, {"unlimited", 0}} {
		t.Run(c.name, func(t *testing.T) {
			root, err := workspace.OpenRoot(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { root.Close() })
			rt := t.TempDir()
			os.Chmod(filepath.Dir(rt), 0o711)
			m := sessions.New(sessions.Config{Workspaces: root, PoolSize: 0, KernelLimits: local.Limits{MemoryBytes: c.memory}},
				kernelspecs.Load([]string{testkernels.Dir(t)}), &local.Provisioner{RuntimeDir: rt}, nil)
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				m.Close(ctx)
			})
			url := serve(t, New(Config{}, m))
			id, _, _ := create(t, url, `{}`)
			status, out := send(t, "GET", url+"/sandboxes/"+id, "", apiKey)
			var info struct {
				CPUCount int   `json:"cpuCount"`
				MemoryMB int64 `json:"memoryMB"`
			}
			if status != http.StatusOK || json.Unmarshal([]byte(out), &info) != nil {
				t.Fatalf("GET the sandbox: %d %s", status, out)
			}
			want := c.memory >> 20
			if c.memory == 0 {
				want = totalMemoryMB(t)
			}
			if info.CPUCount != runtime.NumCPU() || info.MemoryMB != want {
				t.Errorf("cpuCount %d, memoryMB %d; want %d, %d", info.CPUCount, info.MemoryMB, runtime.NumCPU(), want)
			}
		})
	}
}

// totalMemoryMB is MemTotal of /proc/meminfo in MiB.
func totalMemoryMB(t *testing.T) int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			var kib int64
			fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), &kib)
			return kib >> 10
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}

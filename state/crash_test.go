//go:build linux

package state

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// crashEnv makes the test binary the writer of TestCrashDurability.
const crashEnv = "KERNELGATE_STATE_CRASH_WRITER"

// holderEnv makes the test binary a process that holds a store open
// until its stdin closes.
const holderEnv = "KERNELGATE_STATE_HOLDER"

func holdStore(path string) {
	b, err := Open(path, Options{})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	fmt.Println("open")
	io.Copy(io.Discard, os.Stdin)
	b.Close()
}

// TestBoltLockedByAnotherProcess: while another process holds the store,
// Open fails with ErrLocked naming that process, within its lock timeout;
// once it has gone, the store opens with what it wrote.
func TestBoltLockedByAnotherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holderEnv+"="+path)
	stdin, err := cmd.StdinPipe()
	must(t, err)
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	defer cmd.Wait()
	defer stdin.Close()
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if line != "open\n" {
		t.Fatalf("holder: %q", line)
	}
	_, err = Open(path, Options{LockTimeout: 200 * time.Millisecond})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "process "+strconv.Itoa(cmd.Process.Pid)) {
		t.Fatalf("open while another process holds it: %v, want ErrLocked naming process %d", err, cmd.Process.Pid)
	}
	stdin.Close()
	must(t, cmd.Wait())
	b := openBolt(t, path, nil)
	must(t, b.Close())
}

// TestMain runs the crash writer when asked to, before any test.
func TestMain(m *testing.M) {
	if path := os.Getenv(crashEnv); path != "" {
		crashWriter(path)
		return
	}
	if path := os.Getenv(holderEnv); path != "" {
		holdStore(path)
		return
	}
	os.Exit(m.Run())
}

// crashWriter writes kernels (durable) and runs (queued, flushed every
// 10th) as fast as it can, printing "kernel N" once a kernel write has
// returned and "flushed N" once the runs up to N are flushed, and kills
// itself with SIGKILL at a random moment: before, during or after an
// acknowledged write.
func crashWriter(path string) {
	b, err := Open(path, Options{})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	out := os.Stdout // unbuffered: a line written is a line the parent reads
	delay := time.Duration(rand.IntN(40_000)) * time.Microsecond
	time.AfterFunc(delay, func() { syscall.Kill(os.Getpid(), syscall.SIGKILL) })
	ctx := context.Background()
	for i := 0; ; i++ {
		id := fmt.Sprintf("k%06d", i)
		k := sampleKernel(id)
		k.Cwd = strings.Repeat("c", i%5000) // records of many sizes
		if err := b.PutKernel(ctx, k); err != nil {
			fmt.Fprintln(out, "error:", err)
			os.Exit(2)
		}
		fmt.Fprintln(out, "kernel", i)
		rid := fmt.Sprintf("r%06d", i)
		b.PutRun(rid, []byte(rid))
		b.AppendRunEvents(rid, Event{1, []byte(rid)})
		if i%10 == 9 {
			if err := b.Flush(ctx); err == nil {
				fmt.Fprintln(out, "flushed", i)
			}
		}
	}
}

// TestCrashDurability kills a writer process with SIGKILL at random
// moments, then opens its store: the store opens without being moved
// aside, every kernel whose write returned is there whole, every flushed
// run is there, and nothing is there half.
func TestCrashDurability(t *testing.T) {
	for round := range 6 {
		t.Run(strconv.Itoa(round), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, FileName)
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), crashEnv+"="+path)
			stdout, err := cmd.StdoutPipe()
			must(t, err)
			must(t, cmd.Start())
			lastKernel, lastFlushed := -1, -1
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				switch {
				case len(f) == 2 && f[0] == "kernel":
					lastKernel, _ = strconv.Atoi(f[1])
				case len(f) == 2 && f[0] == "flushed":
					lastFlushed, _ = strconv.Atoi(f[1])
				default:
					t.Errorf("writer: %s", sc.Text())
				}
			}
			err = cmd.Wait()
			if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("the writer was not killed: %v", err)
			}
			var logs logBuffer
			b := openBolt(t, path, &logs)
			defer b.Close()
			if strings.Contains(logs.String(), "moved aside") {
				t.Fatalf("a crash left a store that had to be moved aside:\n%s", logs.String())
			}
			snap, err := b.Load(context.Background())
			must(t, err)
			for i, k := range snap.Kernels {
				want := sampleKernel(fmt.Sprintf("k%06d", i))
				want.Cwd = strings.Repeat("c", i%5000)
				if k.ID != want.ID || k.Cwd != want.Cwd || string(k.ProvisionerInfo) != string(want.ProvisionerInfo) {
					t.Fatalf("kernel %d is %q (cwd %d bytes), want %q whole", i, k.ID, len(k.Cwd), want.ID)
				}
			}
			if len(snap.Kernels) < lastKernel+1 {
				t.Errorf("%d kernels after the crash; %d were acknowledged", len(snap.Kernels), lastKernel+1)
			}
			runs := map[string]bool{}
			for _, r := range snap.Runs {
				runs[r.ID] = string(r.Data) == r.ID && len(r.Events) == 1
			}
			for i := 0; i <= lastFlushed; i++ {
				if id := fmt.Sprintf("r%06d", i); !runs[id] {
					t.Fatalf("run %s was flushed before the crash and is missing or partial", id)
				}
			}
			t.Logf("killed after %d acknowledged kernels and %d flushed runs; found %d kernels, %d runs", lastKernel+1, lastFlushed+1, len(snap.Kernels), len(snap.Runs))
		})
	}
}

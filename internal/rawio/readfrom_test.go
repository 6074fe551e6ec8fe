//go:build linux

package rawio

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// A file copied to a Conn is sent by the kernel (sendfile): its bytes
// never pass through a buffer of the process, as they do through the raw
// writes, whether the file comes alone (io.Copy) or behind an
// io.LimitedReader (io.CopyN, as net/http's responses hand it). Anything
// else (here a reader with neither WriteTo nor a descriptor) still
// arrives whole.
func TestReadFromSendsFilesInTheKernel(t *testing.T) {
	c, peer := pair(t, "tcp")
	want := payload(4 << 20)
	name := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(name, want, 0o600); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	for _, tc := range []struct {
		name string
		copy func(f *os.File) (int64, error)
	}{
		{"io.Copy", func(f *os.File) (int64, error) { return io.Copy(c, f) }},
		{"io.CopyN", func(f *os.File) (int64, error) { return io.CopyN(c, f, int64(len(want))) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := os.Open(name)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			read := make(chan error, 1)
			go func() {
				_, err := io.ReadFull(peer, got)
				read <- err
			}()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			n, err := tc.copy(f)
			runtime.ReadMemStats(&after)
			if err != nil || n != int64(len(want)) {
				t.Fatalf("copied %d, %v; want %d", n, err, len(want))
			}
			if err := <-read; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("peer read other bytes than the file's")
			}
			// A copy through the process takes a buffer of at least
			// 32 KiB; sendfile takes none.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc >= 16<<10 {
				t.Errorf("copying %d MiB allocated %d bytes: the file went through the process, not sendfile", len(want)>>20, alloc)
			}
		})
	}
	t.Run("not a file", func(t *testing.T) {
		small := want[:100<<10]
		read := make(chan error, 1)
		go func() {
			_, err := io.ReadFull(peer, got[:len(small)])
			read <- err
		}()
		n, err := io.Copy(c, struct{ io.Reader }{bytes.NewReader(small)})
		if err != nil || n != int64(len(small)) {
			t.Fatalf("ReadFrom = %d, %v", n, err)
		}
		if err := <-read; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[:len(small)], small) {
			t.Fatal("peer read other bytes than written")
		}
	})
}

//go:build linux

package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// benchFiles measures the files of a context: a PUT of filesMiB MiB from a
// file on disk (the gateway streams it into a temporary file, fsyncs it
// and renames it into place) against cp of the same file followed by an
// fsync, and a GET of it into a file (the harness splices the body from
// its socket into the file) against a plain cp, and a GET into /dev/null
// against cp into /dev/null; the download into a file also against dd's
// read/write copy (cp and cat copy inside the kernel here), and its CPU; interleaved, with
// the gateway's peak RSS growth over the transfers. The workspaces and the
// copies live on the same disk (the system's temporary folder).
func (b *bench) benchFiles(ctx context.Context) error {
	size := int64(b.opt.filesMiB) << 20
	dir, err := os.MkdirTemp("", "kgbench-files-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "src.bin")
	if err := writeRandom(src, size); err != nil {
		return err
	}
	fctx, cancel := within(ctx, 30*time.Minute)
	defer cancel()
	id, _, err := b.kg.createContext(fctx, "python")
	if err != nil {
		return err
	}
	defer b.kg.deleteContext(context.Background(), id)
	rss0, _, err := memStatus(b.kg.pid())
	if err != nil {
		return err
	}
	if err := resetPeak(b.kg.pid()); err != nil {
		return err
	}
	// The floor of a download over loopback TCP: the same client from a
	// bare net/http file server (sendfile, no gateway).
	bare, stopBare, err := startBareServer(src)
	if err != nil {
		return err
	}
	defer stopBare()
	var up, upCp, down, downCp, downDd, downBare, null, nullCp, cpuDown, cpuGw, cpuCp, cpuDd, cpuBare sample
	for i := 0; i < b.opt.filesRuns; i++ {
		progress("files: run %d of %d", i+1, b.opt.filesRuns)
		d, err := measure(func() error { _, err := cpFile(src, filepath.Join(dir, "cp-sync.bin"), true); return err })
		if err != nil {
			return err
		}
		upCp = append(upCp, d)
		d, err = measure(func() error { return b.kg.upload(fctx, id, "data.bin", src, size) })
		if err != nil {
			return err
		}
		up = append(up, d)
		var cpu time.Duration
		d, err = measure(func() (err error) { cpu, err = cpFile(src, filepath.Join(dir, "cp.bin"), false); return err })
		if err != nil {
			return err
		}
		downCp = append(downCp, d)
		cpuCp = append(cpuCp, cpu)
		// Each copy's gigabyte of dirty pages goes before the next copy
		// starts, as nothing was left to write back when cp started:
		// otherwise the next one's writes share the disk with that
		// writeback, which cp never does.
		os.Remove(filepath.Join(dir, "cp.bin"))
		// A copy through a process's memory (read, write), as a program
		// that does not ask the kernel to copy for it would make.
		d, err = measure(func() (err error) { cpu, err = ddFile(src, filepath.Join(dir, "dd.bin")); return err })
		if err != nil {
			return err
		}
		downDd = append(downDd, d)
		cpuDd = append(cpuDd, cpu)
		os.Remove(filepath.Join(dir, "dd.bin"))
		// The download's CPU: the gateway's and this process's (the
		// client's splicing, and on loopback the TCP work the kernel
		// does in either).
		g0, _ := cpuTime(b.kg.pid())
		s0 := selfCPU()
		d, err = measure(func() error { return b.kg.download(fctx, id, "data.bin", filepath.Join(dir, "down.bin"), size) })
		if err != nil {
			return err
		}
		g1, _ := cpuTime(b.kg.pid())
		down = append(down, d)
		cpuDown = append(cpuDown, g1-g0+selfCPU()-s0)
		cpuGw = append(cpuGw, g1-g0)
		os.Remove(filepath.Join(dir, "down.bin"))
		s0 = selfCPU()
		d, err = measure(func() error { return bare.download(fctx, "-", "-", filepath.Join(dir, "bare.bin"), size) })
		if err != nil {
			return err
		}
		downBare = append(downBare, d)
		cpuBare = append(cpuBare, selfCPU()-s0)
		os.Remove(filepath.Join(dir, "bare.bin"))
		// Both discarding: cp into /dev/null, the body spliced there.
		d, err = measure(func() error { _, err := cpFile(src, os.DevNull, false); return err })
		if err != nil {
			return err
		}
		nullCp = append(nullCp, d)
		d, err = measure(func() error { return b.kg.download(fctx, id, "data.bin", os.DevNull, size) })
		if err != nil {
			return err
		}
		null = append(null, d)
		os.Remove(filepath.Join(dir, "cp-sync.bin"))
	}
	_, hwm, err := memStatus(b.kg.pid())
	if err != nil {
		return err
	}
	rate := func(d time.Duration) float64 { return float64(size) / (1 << 20) / d.Seconds() }
	label := fmt.Sprintf("%d MiB", b.opt.filesMiB)
	b.add(row{
		figure: "files: upload " + label + " (PUT, fsync; vs cp + fsync), MiB/s p50",
		kg:     fmt.Sprintf("%.0f", rate(up.p50())), direct: fmt.Sprintf("%.0f (cp)", rate(upCp.p50())),
		ratios: fmt.Sprintf("kernelgate/cp %.2f", rate(up.p50())/rate(upCp.p50())),
	})
	b.add(row{
		figure: "files: download " + label + " (GET, the body spliced into a file; vs cp, and dd's read/write copy, into a file, same filesystem; sources in the page cache), MiB/s p50",
		kg:     fmt.Sprintf("%.0f", rate(down.p50())), direct: fmt.Sprintf("%.0f (cp) / %.0f (dd)", rate(downCp.p50()), rate(downDd.p50())),
		ratios: fmt.Sprintf("kernelgate/cp %.2f, kernelgate/dd %.2f", rate(down.p50())/rate(downCp.p50()), rate(down.p50())/rate(downDd.p50())),
	})
	b.add(row{
		figure: "files: download " + label + " into a file from a bare net/http file server (sendfile, the same client and loopback TCP, no gateway), MiB/s p50",
		kg:     fmt.Sprintf("%.0f", rate(down.p50())), direct: fmt.Sprintf("%.0f (bare) / %.0f (cp)", rate(downBare.p50()), rate(downCp.p50())),
		ratios: fmt.Sprintf("kernelgate/bare %.2f, bare/cp %.2f (client CPU, bare: %.0f ms)", rate(down.p50())/rate(downBare.p50()), rate(downBare.p50())/rate(downCp.p50()), ms(cpuBare.p50())),
	})
	b.add(row{
		figure: "files: download " + label + " into a file, CPU (gateway + client, of which the gateway; vs cp, dd), ms p50",
		kg:     fmt.Sprintf("%.0f (gateway %.0f)", ms(cpuDown.p50()), ms(cpuGw.p50())), direct: fmt.Sprintf("%.0f (cp) / %.0f (dd)", ms(cpuCp.p50()), ms(cpuDd.p50())),
		ratios: fmt.Sprintf("kernelgate/cp %.2f×", float64(cpuDown.p50())/float64(cpuCp.p50())),
	})
	b.add(row{
		figure: "files: download " + label + ", both discarding (GET, the body spliced into /dev/null; vs cp into /dev/null), MiB/s p50",
		kg:     fmt.Sprintf("%.0f", rate(null.p50())), direct: fmt.Sprintf("%.0f (cp)", rate(nullCp.p50())),
		ratios: fmt.Sprintf("kernelgate/cp %.2f", rate(null.p50())/rate(nullCp.p50())),
	})
	growth := hwm - rss0
	b.add(row{figure: "files: gateway peak RSS growth over the transfers, MiB", kg: fmt.Sprintf("%.1f", mib(growth))})
	b.check("a 1 GiB upload and download never sit in the gateway's memory (peak RSS growth < 32 MiB)", growth < 32<<20, "%.1f MiB over %d MiB transfers", mib(growth), b.opt.filesMiB)
	return nil
}

// writeRandom writes size random bytes to path.
func writeRandom(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.CopyN(f, rand.Reader, size); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// cpFile runs cp, then fsyncs the copy when sync is set; it returns cp's
// CPU time.
func cpFile(src, dst string, sync bool) (time.Duration, error) {
	cpu, err := runCPU(exec.Command("cp", src, dst))
	if err != nil || !sync {
		return cpu, err
	}
	f, err := os.OpenFile(dst, os.O_WRONLY, 0)
	if err != nil {
		return cpu, err
	}
	defer f.Close()
	return cpu, f.Sync()
}

// ddFile copies src to dst with dd in 256 KiB blocks: read into the
// process, written out (no copy_file_range, unlike cp and cat here).
// It returns dd's CPU time.
func ddFile(src, dst string) (time.Duration, error) {
	return runCPU(exec.Command("dd", "if="+src, "of="+dst, "bs=256K", "status=none"))
}

// runCPU runs cmd and returns its CPU time (user + system).
func runCPU(cmd *exec.Cmd) (time.Duration, error) {
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%s: %v: %s", filepath.Base(cmd.Path), err, out)
	}
	return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), nil
}

// upload PUTs the file src as path of context id.
func (s *server) upload(ctx context.Context, id, path, src string, size int64) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	req, err := http.NewRequestWithContext(ctx, "PUT", s.url+"api/contexts/"+id+"/files/"+path, f)
	if err != nil {
		return err
	}
	req.ContentLength = size
	req.Header.Set("Authorization", "token "+s.token)
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("PUT: %s", resp.Status)
	}
	return nil
}

// download GETs path of context id into the file dst, as cp writes
// its copy: into a file on the same filesystem. It is a raw HTTP/1.1 GET
// on a TCP connection of its own; once the header is read, the body goes
// from the socket into the file through (*os.File).ReadFrom, which
// splices it in the kernel (socket → pipe → file) as cp's
// copy_file_range copies file → file, with no copy through the harness's
// memory. (Go's http.Client hands the body through a bufio.Reader and
// the caller's buffer: two copies in user space, which made the harness,
// not the gateway, the limit of this row.)
func (s *server) download(ctx context.Context, id, path, dst string, size int64) error {
	u, err := url.Parse(s.url)
	if err != nil {
		return err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return err
	}
	conn := nc.(*net.TCPConn)
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := "GET /api/contexts/" + id + "/files/" + path + " HTTP/1.1\r\nHost: " + u.Host +
		"\r\nAuthorization: token " + s.token + "\r\nConnection: close\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		return err
	}
	// The header is read through a small buffer; what of the body came
	// with it is written first, the rest is spliced.
	br := bufio.NewReaderSize(conn, 4096)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET: %s", resp.Status)
	}
	if resp.ContentLength != size || len(resp.TransferEncoding) > 0 {
		return fmt.Errorf("GET: Content-Length %d (%v), want %d", resp.ContentLength, resp.TransferEncoding, size)
	}
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer f.Close()
	head, _ := br.Peek(br.Buffered())
	if int64(len(head)) > size {
		return fmt.Errorf("GET: more than %d bytes", size)
	}
	if _, err := f.Write(head); err != nil {
		return err
	}
	n, err := f.ReadFrom(io.LimitReader(conn, size-int64(len(head))))
	if err == nil && int64(len(head))+n != size {
		err = fmt.Errorf("GET: %d bytes, want %d", int64(len(head))+n, size)
	}
	return err
}

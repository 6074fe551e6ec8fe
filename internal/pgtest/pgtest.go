// Package pgtest runs a private PostgreSQL server for a test: initdb in a
// temporary folder, the server on a free loopback port, as the user
// postgres when the test runs as root (initdb refuses root). It is
// stopped and its folder removed when the test ends; no process is left
// behind. Without PostgreSQL the test skips through needs.Skip.
package pgtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"kernelgate/internal/needs"
)

// BinDirs are where Debian and others put PostgreSQL's server programs,
// newest first.
var BinDirs = []string{
	"/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin",
	"/usr/lib/postgresql/14/bin", "/usr/lib/postgresql/13/bin",
}

// Server is a running private PostgreSQL server.
type Server struct {
	bin  string
	dir  string // the folder holding data/ and the log
	port int
	cred *syscall.Credential
	t    testing.TB
}

// findBin returns the folder holding initdb and pg_ctl, "" when none.
func findBin() string {
	for _, d := range BinDirs {
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			return d
		}
	}
	// A link on PATH to the real folder, which holds the others.
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Dir(real)
		}
	}
	return ""
}

// Start initialises and starts a server for t, stopped at its end.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := findBin()
	if bin == "" {
		needs.Skip(t, "no PostgreSQL server programs (initdb, pg_ctl): install postgresql-15")
		return nil
	}
	s := &Server{bin: bin, t: t}
	dir, err := os.MkdirTemp("", "kgpg-")
	if err != nil {
		t.Fatal(err)
	}
	s.dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			needs.Skip(t, "PostgreSQL refuses to run as root and there is no user postgres: %v", err)
			return nil
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	s.port = freePort(t)
	s.run("initdb", "-D", s.data(), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
	conf := fmt.Sprintf("\nlisten_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\nfsync = on\nmax_connections = 40\n", s.port, dir)
	f, err := os.OpenFile(filepath.Join(s.data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(conf)
	f.Close()
	t.Cleanup(func() { s.Stop("immediate") })
	s.StartAgain()
	return s
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

// run runs one of the server programs as the server's user; a failure
// fails the test with its output.
func (s *Server) run(name string, args ...string) string {
	s.t.Helper()
	out, err := s.command(name, args...).CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
		s.t.Fatalf("%s %s: %v\n%s\nserver log:\n%s", name, strings.Join(args, " "), err, out, log)
	}
	return string(out)
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd
}

// URL is the server's database postgres, reached over TCP.
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// CreateDB makes a new database on the server and returns its URL.
func (s *Server) CreateDB(name string) string {
	s.t.Helper()
	s.run("createdb", "-h", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", "postgres", name)
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, name)
}

// Stop stops the server: mode is pg_ctl's -m (smart, fast, immediate).
// It waits for the server to be gone; stopping one that is not running
// does nothing.
func (s *Server) Stop(mode string) {
	if _, err := os.Stat(filepath.Join(s.data(), "postmaster.pid")); err != nil {
		return
	}
	if out, err := s.command("pg_ctl", "stop", "-D", s.data(), "-m", mode, "-w", "-t", "60").CombinedOutput(); err != nil {
		s.t.Errorf("pg_ctl stop: %v\n%s", err, out)
	}
}

// StartAgain starts the stopped server on the same port and data, and
// waits until it accepts connections.
func (s *Server) StartAgain() {
	s.t.Helper()
	s.run("pg_ctl", "start", "-D", s.data(), "-l", filepath.Join(s.dir, "log"), "-w", "-t", "60")
}

// freePort returns a loopback TCP port nothing listens on now.
func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

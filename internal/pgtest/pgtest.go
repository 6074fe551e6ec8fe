// Package pgtest runs a private PostgreSQL server for a test or a
// benchmark: initdb in a temporary folder, the server on a free loopback
// port, as the user postgres when running as root (initdb refuses root).
// Close (or, through Start, the end of the test) stops it and removes its
// folder; no process is left behind. Without PostgreSQL a test skips
// through needs.Skip.
package pgtest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"kernelgate/internal/needs"
)

// BinDirs are where Debian puts PostgreSQL's server programs, newest
// first.
var BinDirs = []string{
	"/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin",
	"/usr/lib/postgresql/14/bin", "/usr/lib/postgresql/13/bin",
}

// ErrMissing: PostgreSQL's server programs, or the user to run them as,
// are not on this machine.
var ErrMissing = errors.New("pgtest: no PostgreSQL server (install postgresql-15)")

// Server is a private PostgreSQL server.
type Server struct {
	bin  string
	dir  string // the folder holding data/ and the log
	port int
	user *ids // the user the server runs as; nil: the caller's
}

// ids are a user's uid and gid.
type ids struct{ uid, gid int }

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

// Launch initialises and starts a server. The caller Closes it.
func Launch() (_ *Server, err error) {
	bin := findBin()
	if bin == "" {
		return nil, ErrMissing
	}
	s := &Server{bin: bin}
	if s.dir, err = os.MkdirTemp("", "kgpg-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("%w: PostgreSQL refuses to run as root and there is no user postgres: %v", ErrMissing, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.user = &ids{uid, gid}
		if err := os.Chown(s.dir, uid, gid); err != nil {
			return nil, err
		}
	}
	if s.port, err = freePort(); err != nil {
		return nil, err
	}
	if err := s.run("initdb", "-D", s.data(), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf("\nlisten_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\nmax_connections = 40\n", s.port, s.dir)
	f, err := os.OpenFile(filepath.Join(s.data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	_, err = f.WriteString(conf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return s, s.StartAgain()
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

// run runs one of the server programs as the server's user.
func (s *Server) run(name string, args ...string) error {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	if s.user != nil {
		runAs(cmd, *s.user)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
		return fmt.Errorf("pgtest: %s %s: %v\n%s\nserver log:\n%s", name, strings.Join(args, " "), err, out, log)
	}
	return nil
}

// URL is the server's database postgres, reached over TCP.
func (s *Server) URL() string { return s.dbURL("postgres") }

func (s *Server) dbURL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// CreateDB makes a new database on the server and returns its URL.
func (s *Server) CreateDB(name string) (string, error) {
	if err := s.run("createdb", "-h", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", "postgres", name); err != nil {
		return "", err
	}
	return s.dbURL(name), nil
}

// Stop stops the server: mode is pg_ctl's -m (smart, fast, immediate).
// It returns once the server is gone; stopping one that is not running
// does nothing.
func (s *Server) Stop(mode string) error {
	if _, err := os.Stat(filepath.Join(s.data(), "postmaster.pid")); err != nil {
		return nil
	}
	return s.run("pg_ctl", "stop", "-D", s.data(), "-m", mode, "-w", "-t", "60")
}

// StartAgain starts the stopped server on the same port and data, and
// returns once it accepts connections.
func (s *Server) StartAgain() error {
	return s.run("pg_ctl", "start", "-D", s.data(), "-l", filepath.Join(s.dir, "log"), "-w", "-t", "60")
}

// Close stops the server at once and removes its folder.
func (s *Server) Close() error {
	err := s.Stop("immediate")
	os.RemoveAll(s.dir)
	return err
}

// freePort returns a loopback TCP port nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// TB is a Server of a test: its methods fail the test on an error.
type TB struct {
	*Server
	t testing.TB
}

// Start launches a server for t, closed when t ends. Without
// PostgreSQL t skips (needs.Skip: a failure under KERNELGATE_REQUIRE_ALL).
func Start(t testing.TB) *TB {
	t.Helper()
	s, err := Launch()
	if errors.Is(err, ErrMissing) {
		needs.Skip(t, "%v", err)
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("stopping PostgreSQL: %v", err)
		}
	})
	return &TB{s, t}
}

// CreateDB makes a new database and returns its URL.
func (s *TB) CreateDB(name string) string {
	s.t.Helper()
	u, err := s.Server.CreateDB(name)
	if err != nil {
		s.t.Fatal(err)
	}
	return u
}

// Stop stops the server (pg_ctl's -m mode).
func (s *TB) Stop(mode string) {
	s.t.Helper()
	if err := s.Server.Stop(mode); err != nil {
		s.t.Fatal(err)
	}
}

// StartAgain starts the stopped server again.
func (s *TB) StartAgain() {
	s.t.Helper()
	if err := s.Server.StartAgain(); err != nil {
		s.t.Fatal(err)
	}
}

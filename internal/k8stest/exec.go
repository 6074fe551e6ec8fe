package k8stest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/apimachinery/pkg/util/httpstream/spdy"
	rc "k8s.io/apimachinery/pkg/util/remotecommand"

	"kernelgate/internal/sysproc"
)

// The node's kubelet endpoint serves exec as a kubelet does: the
// apiserver proxies pods/exec to https://NODE:PORT/exec/NS/POD/CONTAINER
// with its kubelet client certificate, upgraded to SPDY (a client's
// websocket is translated to SPDY by the apiserver). The command runs as a
// process in the container's environment, its cwd and env, in the
// container process's process group (so not a group leader, as a
// runtime's exec is not); it is killed when the container's process ends
// (also when it made a process group of its own) or when the stream goes.
// Its exit status (128+n for signal n) goes on the error stream as the
// kubelet reports it. No tty: a request for one is refused.

// execStreamTimeout bounds how long the client has to open its streams.
const execStreamTimeout = 30 * time.Second

// kubelet serves a node's kubelet endpoint.
type kubelet struct {
	p   *provider
	srv *http.Server
	ln  net.Listener

	ctx    context.Context // ends when the node stops: execs end
	cancel context.CancelFunc
	served chan struct{} // closed when Serve has returned

	mu      sync.Mutex
	stopped bool
	wg      sync.WaitGroup // the exec handlers, which outlive Close (hijacked)
}

// startKubelet listens on 127.0.0.1 with TLS and serves exec for p's pods.
func startKubelet(p *provider, pki *pki, node string) (*kubelet, error) {
	cfg, err := pki.kubeletTLS(node)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	k := &kubelet{p: p, ln: ln, ctx: ctx, cancel: cancel, served: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/exec/{namespace}/{pod}/{container}", k.serveExec)
	k.srv = &http.Server{Handler: mux, TLSConfig: cfg, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(k.served)
		k.srv.ServeTLS(ln, "", "") // returns at Close
	}()
	return k, nil
}

// port is the kubelet endpoint's port.
func (k *kubelet) port() int { return k.ln.Addr().(*net.TCPAddr).Port }

// stop closes the endpoint, ends the execs and waits for their handlers.
func (k *kubelet) stop() {
	k.mu.Lock()
	k.stopped = true
	k.mu.Unlock()
	k.srv.Close()
	<-k.served
	k.cancel()
	k.wg.Wait()
}

// execTarget is what an exec runs in: the container's process.
type execTarget struct {
	run  *runningProcess
	argv []string
}

// target finds the running process of a container, and resolves argv[0]
// with the container's PATH.
func (k *kubelet) target(ns, pod, container string, argv []string) (*execTarget, int, error) {
	if len(argv) == 0 || argv[0] == "" {
		return nil, http.StatusBadRequest, errors.New("no command")
	}
	k.p.mu.Lock()
	var run *runningProcess
	r, ok := k.p.pods[podKey(ns, pod)]
	if ok {
		for _, c := range r.containers {
			if c.spec.Name == container {
				run = c.running
			}
		}
	}
	k.p.mu.Unlock()
	switch {
	case !ok:
		return nil, http.StatusNotFound, fmt.Errorf("pod %s/%s is not on this node", ns, pod)
	case run == nil:
		return nil, http.StatusBadRequest, fmt.Errorf("container %s of pod %s/%s is not running", container, ns, pod)
	}
	exe, err := lookPathIn(argv[0], run.env, run.dir)
	if err != nil {
		// As a runtime reports it: the stream is refused, no exit code.
		return nil, http.StatusBadRequest, err
	}
	argv = append([]string{exe}, argv[1:]...)
	if run.mountNS {
		if argv, err = inMountNamespace(run.pid, run.dir, argv); err != nil {
			return nil, http.StatusInternalServerError, err
		}
	}
	return &execTarget{run: run, argv: argv}, 0, nil
}

// lookPathIn finds file as a shell of env in dir would.
func lookPathIn(file string, env []string, dir string) (string, error) {
	if strings.Contains(file, "/") {
		if !filepath.IsAbs(file) {
			file = filepath.Join(dir, file)
		}
		return file, nil
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, file)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec: %q: executable file not found in $PATH", file)
}

func (k *kubelet) serveExec(w http.ResponseWriter, req *http.Request) {
	k.mu.Lock()
	if k.stopped {
		k.mu.Unlock()
		http.Error(w, "the node is stopping", http.StatusServiceUnavailable)
		return
	}
	k.wg.Add(1)
	k.mu.Unlock()
	defer k.wg.Done()
	q := req.URL.Query()
	if q.Get("tty") == "1" || q.Get("tty") == "true" {
		http.Error(w, "the test node has no tty", http.StatusBadRequest)
		return
	}
	want := map[string]bool{"error": true,
		"stdin": flag(q.Get("input")), "stdout": flag(q.Get("output")), "stderr": flag(q.Get("error"))}
	t, code, err := k.target(req.PathValue("namespace"), req.PathValue("pod"), req.PathValue("container"), q["command"])
	if err != nil {
		http.Error(w, err.Error(), code)
		return
	}
	if _, err := httpstream.Handshake(req, w, []string{rc.StreamProtocolV5Name, rc.StreamProtocolV4Name}); err != nil {
		return // Handshake answered
	}
	type created struct {
		s         httpstream.Stream
		replySent <-chan struct{}
	}
	arrived := make(chan created, 8)
	conn := spdy.NewResponseUpgrader().UpgradeResponse(w, req, func(s httpstream.Stream, replySent <-chan struct{}) error {
		select {
		case arrived <- created{s, replySent}:
			return nil
		default:
			return errors.New("too many streams")
		}
	})
	if conn == nil {
		return // UpgradeResponse answered
	}
	defer conn.Close()
	// Every stream the client asked for, each once its reply is sent (a
	// write before it would reach the client ahead of the stream).
	streams := map[string]httpstream.Stream{}
	var replies []<-chan struct{}
	timeout := time.NewTimer(execStreamTimeout)
	defer timeout.Stop()
	for len(streams) < count(want) {
		select {
		case c := <-arrived:
			typ := c.s.Headers().Get("streamType")
			if !want[typ] || streams[typ] != nil {
				c.s.Reset()
				continue
			}
			streams[typ] = c.s
			replies = append(replies, c.replySent)
		case <-timeout.C:
			return
		case <-conn.CloseChan():
			return
		case <-k.ctx.Done():
			return
		}
	}
	for _, sent := range replies {
		select {
		case <-sent:
		case <-timeout.C:
			return
		case <-conn.CloseChan():
			return
		case <-k.ctx.Done():
			return
		}
	}
	status := k.run(t, streams, conn.CloseChan())
	json.NewEncoder(streams["error"]).Encode(status)
	for _, s := range streams {
		s.Close()
	}
}

func flag(v string) bool { return v == "1" || v == "true" }

func count(m map[string]bool) int {
	n := 0
	for _, v := range m {
		if v {
			n++
		}
	}
	return n
}

// run runs the command with the streams and returns its status.
func (k *kubelet) run(t *execTarget, streams map[string]httpstream.Stream, gone <-chan bool) *metav1.Status {
	cmd := exec.Command(t.argv[0], t.argv[1:]...)
	cmd.Env = t.run.env
	cmd.Dir = t.run.dir
	cmd.SysProcAttr = joinGroupAttr(t.run.pid)
	cmd.WaitDelay = time.Second // output held open by a child that left
	if s := streams["stdout"]; s != nil {
		cmd.Stdout = s
	}
	if s := streams["stderr"]; s != nil {
		cmd.Stderr = s
	}
	var stdin io.WriteCloser
	if streams["stdin"] != nil {
		var err error
		if stdin, err = cmd.StdinPipe(); err != nil {
			return failure(err)
		}
	}
	if err := cmd.Start(); err != nil {
		return failure(err)
	}
	pid := cmd.Process.Pid
	k.p.mu.Lock()
	t.run.execs[pid] = true
	k.p.mu.Unlock()
	defer func() {
		k.p.mu.Lock()
		delete(t.run.execs, pid)
		k.p.mu.Unlock()
	}()
	copied := make(chan struct{})
	if stdin != nil {
		go func() { // ends at the stream's EOF, or when the connection closes
			defer close(copied)
			io.Copy(stdin, streams["stdin"])
			stdin.Close()
		}()
	} else {
		close(copied)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var err error
	ended := false
	select {
	case err = <-exited:
		ended = true
	case <-gone:
	case <-k.ctx.Done():
	}
	if !ended { // the client went, or the node stops
		sysproc.Kill(pid, syscall.SIGKILL)
		sysproc.Kill(-pid, syscall.SIGKILL)
		err = <-exited
	}
	if stdin != nil {
		streams["stdin"].Reset() // the command no longer reads it
	}
	<-copied
	code := int(exitCode(cmd, err))
	if code == 0 {
		return &metav1.Status{Status: metav1.StatusSuccess}
	}
	return &metav1.Status{
		Status:  metav1.StatusFailure,
		Reason:  rc.NonZeroExitCodeReason,
		Message: fmt.Sprintf("command terminated with non-zero exit code: exit status %d", code),
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: rc.ExitCodeCauseType, Message: strconv.Itoa(code)}}},
	}
}

func failure(err error) *metav1.Status {
	return &metav1.Status{Status: metav1.StatusFailure, Message: err.Error()}
}

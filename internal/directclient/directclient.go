// Package directclient is a deliberately minimal Jupyter client on zmq4's
// sockets, the baseline that package jupyter and the gateway are
// benchmarked against.
//
// It does only what a start and an execute round trip need: spawn the
// kernel from its kernelspec, dial shell, control and iopub, sign and verify
// with HMAC-SHA256, and wait for an execute_reply together with the status:
// idle of the same request. It has no routing table, no stdin, heartbeat,
// interrupt or restart, and it shares no code with package jupyter, so that
// any overhead there shows up as a difference against this client.
//
// Each kernel gets a private temporary directory that holds its connection
// file and serves as its HOME, so that it neither reads nor writes the
// user's IPython or Deno state (kernelgate's launcher does the same).
//
// A Client is used by one goroutine at a time. It is not meant for
// production use.
package directclient

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/google/uuid"

	"kernelgate/internal/tailbuf"
	"kernelgate/kernelspecs"

	"kernelgate/internal/sysproc"
	"kernelgate/internal/timefmt"
)

// ErrKernelExited means the kernel process ended while the client waited.
var ErrKernelExited = errors.New("directclient: kernel exited")

const (
	dialRetry  = 5 * time.Millisecond
	nudgeAfter = 500 * time.Millisecond // resend kernel_info when unanswered
	iopubAfter = 100 * time.Millisecond // resend when iopub stays silent after a reply
	killAfter  = 2 * time.Second        // shutdown_request grace before SIGKILL
)

var delimiter = []byte("<IDS|MSG>")

// Client is one kernel process and the three sockets connected to it.
type Client struct {
	cmd      *exec.Cmd
	dir      string // private: connection file and HOME
	connFile string
	output   *tailbuf.Buffer // the end of the kernel's stdout and stderr
	key      []byte
	session  string
	mac      hash.Hash // signs outgoing messages; used by the caller's goroutine only

	cancel                context.CancelFunc // ends the sockets' context
	shell, control, iopub zmq4.Socket
	replies               chan message // from shell
	pub                   chan message // from iopub
	quit                  chan struct{}
	readers               sync.WaitGroup
	exited                chan struct{} // closed once cmd.Wait returned
	up                    bool          // the kernel became ready

	stopRelay func()

	closeOnce sync.Once
}

// message is what the client looks at in a received message.
type message struct {
	typ     string
	parent  string // parent_header.msg_id
	state   string // execution_state of a status message
	content []byte
}

// Start spawns the kernel of spec and returns once it has answered a
// kernel_info_request and an iopub message has arrived.
func Start(ctx context.Context, spec *kernelspecs.Spec) (*Client, error) {
	return StartThrough(ctx, spec, nil)
}

// Relay puts something between the client and the kernel: given the
// kernel's ports (shell, iopub, stdin, control, hb) it returns the ports
// the client dials instead, and a function that removes it.
type Relay func(kernelPorts [5]int) (dial [5]int, stop func(), err error)

// StartThrough is Start with the client's sockets going through relay
// (nil: straight to the kernel). Close stops the relay after the kernel.
//
// Another process can take a port between freePorts and the kernel's bind
// (other tests and kernels run alongside): a kernel that could not bind
// is started again on other ports, up to three times in all.
func StartThrough(ctx context.Context, spec *kernelspecs.Spec, relay Relay) (*Client, error) {
	for attempt := 1; ; attempt++ {
		c, err := startOnce(ctx, spec, relay)
		if err == nil || attempt == 3 || ctx.Err() != nil || !strings.Contains(err.Error(), "Address already in use") {
			return c, err
		}
	}
}

func startOnce(ctx context.Context, spec *kernelspecs.Spec, relay Relay) (*Client, error) {
	ports, err := pickPorts()
	if err != nil {
		return nil, err
	}
	dialPorts := ports
	stopRelay := func() {}
	if relay != nil {
		if dialPorts, stopRelay, err = relay(ports); err != nil {
			return nil, fmt.Errorf("directclient: relay: %w", err)
		}
	}
	key := make([]byte, 32)
	rand.Read(key)
	c := &Client{
		key:     []byte(hex.EncodeToString(key)),
		session: uuid.NewString(),
		replies: make(chan message, 64),
		pub:     make(chan message, 1024),
		quit:    make(chan struct{}),
		exited:  make(chan struct{}),
		output:  tailbuf.New(4 << 10),
	}
	c.mac = hmac.New(sha256.New, c.key)
	c.stopRelay = stopRelay
	if c.dir, err = os.MkdirTemp("", "directclient-"); err != nil {
		stopRelay()
		return nil, fmt.Errorf("directclient: %w", err)
	}
	if err := c.writeConnFile(ports); err != nil {
		os.RemoveAll(c.dir)
		stopRelay()
		return nil, err
	}
	env := append(os.Environ(), "HOME="+c.dir)
	lookup := func(k string) (string, bool) {
		if k == "HOME" {
			return c.dir, true
		}
		return os.LookupEnv(k)
	}
	argv, specEnv := spec.Command(c.connFile, lookup)
	for k, v := range specEnv {
		env = append(env, k+"="+v)
	}
	// kernelgate sets this too (ipykernel then watches its parent), so both
	// clients talk to identically configured kernels.
	env = append(env, "JPY_PARENT_PID="+strconv.Itoa(os.Getpid()))
	c.cmd = exec.Command(argv[0], argv[1:]...)
	c.cmd.Env = env
	c.cmd.Dir = c.dir
	c.cmd.Stdout, c.cmd.Stderr = c.output, c.output
	c.cmd.SysProcAttr = sysproc.GroupAttr()
	if err := c.cmd.Start(); err != nil {
		os.RemoveAll(c.dir)
		stopRelay()
		return nil, fmt.Errorf("directclient: %w", err)
	}
	go func() {
		c.cmd.Wait()
		close(c.exited)
	}()

	// Dial retries until the kernel binds and cannot see the kernel die:
	// end the sockets' context when the process exits or ctx ends first.
	var sockCtx context.Context
	sockCtx, c.cancel = context.WithCancel(context.Background())
	dialed := make(chan struct{})
	go func() {
		select {
		case <-c.exited:
			c.cancel()
		case <-ctx.Done():
			c.cancel()
		case <-dialed:
		}
	}()
	err = c.dial(sockCtx, dialPorts)
	close(dialed)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("directclient: kernel did not bind its ports: %w", ctx.Err())
	}
	if err == nil {
		err = c.ready(ctx)
	}
	if err != nil {
		c.Close()
		if out := strings.TrimSpace(c.output.String()); out != "" {
			err = fmt.Errorf("%w; kernel output: %s", err, out)
		}
		return nil, err
	}
	c.up = true
	return c, nil
}

// pickPorts chooses a kernel's ports (a test takes one first).
var pickPorts = freePorts

// freePorts returns five ports that were free a moment ago:
// shell, iopub, stdin, control, hb.
func freePorts() ([5]int, error) {
	var ports [5]int
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return ports, fmt.Errorf("directclient: %w", err)
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

func (c *Client) writeConnFile(ports [5]int) error {
	b, err := json.Marshal(map[string]any{
		"shell_port": ports[0], "iopub_port": ports[1], "stdin_port": ports[2],
		"control_port": ports[3], "hb_port": ports[4],
		"ip": "127.0.0.1", "transport": "tcp", "key": string(c.key),
		"signature_scheme": "hmac-sha256", "kernel_name": "",
	})
	if err != nil {
		return err
	}
	c.connFile = filepath.Join(c.dir, "kernel.json")
	if err := os.WriteFile(c.connFile, b, 0o600); err != nil {
		return fmt.Errorf("directclient: %w", err)
	}
	return nil
}

// dial connects iopub (SUB, subscribed to everything) and then shell and
// control (DEALER), and starts one reader per socket that receives. iopub
// goes first so that its subscription has reached the kernel before the
// first request: a kernel drops what it publishes before that.
func (c *Client) dial(ctx context.Context, ports [5]int) error {
	opts := []zmq4.Option{zmq4.WithDialerRetry(dialRetry), zmq4.WithDialerMaxRetries(-1)}
	c.iopub = zmq4.NewSub(ctx, opts...)
	c.shell = zmq4.NewDealer(ctx, opts...)
	c.control = zmq4.NewDealer(ctx, opts...)
	for _, d := range []struct {
		s    zmq4.Socket
		port int
	}{{c.iopub, ports[1]}, {c.shell, ports[0]}, {c.control, ports[3]}} {
		if err := d.s.Dial("tcp://127.0.0.1:" + strconv.Itoa(d.port)); err != nil {
			if ctx.Err() != nil {
				return ErrKernelExited
			}
			return fmt.Errorf("directclient: %w", err)
		}
		if d.s == c.iopub {
			if err := c.iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
				return fmt.Errorf("directclient: %w", err)
			}
		}
	}
	c.readers.Add(2)
	go c.read(c.shell, c.replies)
	go c.read(c.iopub, c.pub)
	return nil
}

// ready sends kernel_info_request until a kernel_info_reply and an iopub
// message have both arrived.
func (c *Client) ready(ctx context.Context) error {
	var gotReply, gotPub bool
	for sent := 1; ; sent++ {
		if _, err := c.send(c.shell, "kernel_info_request", struct{}{}); err != nil {
			return err
		}
		t := time.NewTimer(nudgeAfter)
	wait:
		for {
			select {
			case m := <-c.replies:
				if m.typ == "kernel_info_reply" && !gotReply {
					gotReply = true
					t.Reset(iopubAfter)
				}
			case <-c.pub:
				gotPub = true
			case <-t.C:
				break wait
			case <-c.exited:
				t.Stop()
				return ErrKernelExited
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("directclient: %d kernel_info requests, reply %v, iopub %v: %w", sent, gotReply, gotPub, ctx.Err())
			}
			if gotReply && gotPub {
				t.Stop()
				return nil
			}
		}
		gotReply = false
	}
}

type executeContent struct {
	Code            string            `json:"code"`
	Silent          bool              `json:"silent"`
	StoreHistory    bool              `json:"store_history"`
	UserExpressions map[string]string `json:"user_expressions"`
	AllowStdin      bool              `json:"allow_stdin"`
	StopOnError     bool              `json:"stop_on_error"`
}

// Execute runs code and returns the status of its execute_reply ("ok",
// "error", "aborted") once both that reply and the request's status: idle
// have arrived. Other messages are read and dropped.
func (c *Client) Execute(ctx context.Context, code string) (string, error) {
	id, err := c.send(c.shell, "execute_request", executeContent{
		Code: code, StoreHistory: true, StopOnError: true, UserExpressions: map[string]string{},
	})
	if err != nil {
		return "", err
	}
	var status string
	idle := false
	for status == "" || !idle {
		select {
		case m := <-c.replies:
			if m.parent == id && m.typ == "execute_reply" {
				var r struct {
					Status string `json:"status"`
				}
				if err := json.Unmarshal(m.content, &r); err != nil || r.Status == "" {
					return "", fmt.Errorf("directclient: bad execute_reply %q", m.content)
				}
				status = r.Status
			}
		case m := <-c.pub:
			if m.parent == id && m.state == "idle" {
				idle = true
			}
		case <-c.exited:
			return "", ErrKernelExited
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	return status, nil
}

type header struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	MsgType  string `json:"msg_type"`
	Version  string `json:"version"`
}

var emptyObject = []byte("{}")

// Dates are written as jupyter_client writes them, with microseconds
// (timefmt). The precision matters: ipykernel's jupyter_client parses such
// a date (about 60 µs with dateutil) and leaves one with more digits a
// string, so a client sending nanoseconds would make the kernel do less work.

// send signs and sends a message of type typ and returns its msg_id.
func (c *Client) send(s zmq4.Socket, typ string, content any) (string, error) {
	id := uuid.NewString()
	h, err := json.Marshal(header{MsgID: id, Session: c.session, Username: "direct",
		Date: timefmt.Format(time.Now()), MsgType: typ, Version: "5.3"})
	if err != nil {
		return "", err
	}
	body, err := json.Marshal(content)
	if err != nil {
		return "", err
	}
	c.mac.Reset()
	for _, p := range [][]byte{h, emptyObject, emptyObject, body} {
		c.mac.Write(p)
	}
	sig := hex.AppendEncode(nil, c.mac.Sum(nil))
	return id, s.SendMulti(zmq4.NewMsgFrom(delimiter, sig, h, emptyObject, emptyObject, body))
}

// read is the one goroutine receiving from s. It verifies each message,
// keeps what the client looks at and hands it to out.
func (c *Client) read(s zmq4.Socket, out chan<- message) {
	defer c.readers.Done()
	mac := hmac.New(sha256.New, c.key)
	for {
		zm, err := s.Recv()
		if err != nil {
			return // socket closed or kernel gone
		}
		m, ok := decode(zm.Frames, mac)
		if !ok {
			continue
		}
		select {
		case out <- m:
		case <-c.quit:
			return
		}
	}
}

// decode verifies the signature of frames and parses the few fields the
// client needs. It reports false for anything malformed or badly signed.
func decode(frames [][]byte, mac hash.Hash) (message, bool) {
	i := 0
	for i < len(frames) && string(frames[i]) != string(delimiter) {
		i++
	}
	if len(frames) < i+6 {
		return message{}, false
	}
	mac.Reset()
	for _, p := range frames[i+2 : i+6] {
		mac.Write(p)
	}
	sig := make([]byte, hex.DecodedLen(len(frames[i+1])))
	if _, err := hex.Decode(sig, frames[i+1]); err != nil || !hmac.Equal(sig, mac.Sum(nil)) {
		return message{}, false
	}
	var h struct {
		MsgType string `json:"msg_type"`
	}
	var p struct {
		MsgID string `json:"msg_id"`
	}
	if json.Unmarshal(frames[i+2], &h) != nil || json.Unmarshal(frames[i+3], &p) != nil {
		return message{}, false
	}
	m := message{typ: h.MsgType, parent: p.MsgID, content: frames[i+5]}
	if m.typ == "status" {
		var s struct {
			State string `json:"execution_state"`
		}
		json.Unmarshal(m.content, &s)
		m.state = s.State
	}
	return m, true
}

// PID is the kernel's process id.
func (c *Client) PID() int { return c.cmd.Process.Pid }

// Close sends shutdown_request, waits for the process to exit (SIGKILL to
// its process group after 2 s), closes the sockets, removes the connection
// file and returns once the process is reaped. It is idempotent. A kernel
// that never became ready is killed at once: its control socket may not be
// connected, and a send on it would block.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		wait := killAfter
		if c.up {
			c.send(c.control, "shutdown_request", map[string]bool{"restart": false})
		} else {
			wait = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-c.exited:
		case <-t.C:
			sysproc.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
			<-c.exited
		}
		t.Stop()
		// Whatever the kernel left in its group goes with it.
		sysproc.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		c.cancel()
		close(c.quit)
		for _, s := range []zmq4.Socket{c.shell, c.control, c.iopub} {
			if s != nil {
				s.Close()
			}
		}
		c.readers.Wait()
		c.stopRelay()
		os.RemoveAll(c.dir)
	})
	return nil
}

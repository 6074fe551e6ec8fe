//go:build linux

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/websocket"
)

// Jupyter Server 1.x's GatewayClient loses a client's message that it
// reads before its own websocket to the gateway has started: the message
// never reaches the gateway and the client waits for its reply (README,
// "Jupyter Server 1.x as a proxy"). Under load that is the first
// kernel_info_request of a kernel, now and then; a client that sends its
// first message in the same write as its handshake makes it happen every
// time. kernelgate answers such a message, and through Jupyter Server with
// deploy/jupyter-server/jupyter_server_config.py so does the GatewayClient.
func TestGatewayClientFirstMessage(t *testing.T) {
	if out, err := exec.Command("/usr/bin/python3", "-c", "import jupyter_server").CombinedOutput(); err != nil {
		t.Fatalf("Jupyter Server is missing: run `make test-deps` (Debian package python3-jupyter-server): %s", out)
	}
	bin := buildBinary(t)
	gw := startGateway(t, bin, "--token", "gw-token")
	if err := pipelinedKernelInfo(t, gw.url, "gw-token", "python3", 30*time.Second); err != nil {
		t.Fatalf("kernelgate: %v\n%s", err, gw.logs)
	}

	js := startJupyterServer(t, gw.url, "gw-token", workaroundConfig(t))
	for _, spec := range []string{"python3", "deno"} {
		if err := pipelinedKernelInfo(t, js.url, js.token, spec, 30*time.Second); err != nil {
			t.Fatalf("%s through Jupyter Server with the workaround: %v\nJupyter Server:\n%s", spec, err, js.logs)
		}
	}

	// Without the workaround the message is lost (Jupyter Server 1.23):
	// recorded, not asserted, so that a fixed Jupyter Server passes.
	plain := startJupyterServer(t, gw.url, "gw-token", t.TempDir())
	if err := pipelinedKernelInfo(t, plain.url, plain.token, "python3", 5*time.Second); err != nil {
		t.Logf("through Jupyter Server without the workaround: %v", err)
	} else {
		t.Logf("through Jupyter Server without the workaround: answered (a Jupyter Server without the bug)")
	}
}

// workaroundConfig is a Jupyter configuration directory holding
// deploy/jupyter-server/jupyter_server_config.py.
func workaroundConfig(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	conf, err := os.ReadFile("deploy/jupyter-server/jupyter_server_config.py")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "jupyter_server_config.py"), conf, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// jupyterServer is a running Jupyter Server with --gateway-url.
type jupyterServer struct {
	url, token string
	logs       *lockedBuffer
}

// startJupyterServer runs Jupyter Server in front of the gateway at gwURL,
// with configDir as its configuration directory.
func startJupyterServer(t *testing.T, gwURL, gwToken, configDir string) *jupyterServer {
	t.Helper()
	js := &jupyterServer{token: "js-token", logs: &lockedBuffer{}}
	port := freePort(t)
	cmd := exec.Command("/usr/bin/python3", "-m", "jupyter_server", "--allow-root", "--no-browser",
		"--ip=127.0.0.1", fmt.Sprintf("--port=%d", port), "--ServerApp.token="+js.token, "--ServerApp.root_dir="+t.TempDir(),
		"--gateway-url="+strings.TrimSuffix(gwURL, "/"), "--GatewayClient.auth_token="+gwToken)
	cmd.Env = append(os.Environ(), "JUPYTER_CONFIG_DIR="+configDir, "JUPYTER_DATA_DIR="+t.TempDir(), "JUPYTER_RUNTIME_DIR="+t.TempDir())
	cmd.Stdout, cmd.Stderr = js.logs, js.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		cmd.Wait()
	})
	js.url = fmt.Sprintf("http://127.0.0.1:%d/", port)
	waitHTTP(t, js.url+"api", 60*time.Second)
	return js
}

// pipelinedKernelInfo starts a kernel of spec at the Jupyter REST API at
// base, opens its websocket sending a kernel_info_request in the same
// write as the handshake, and waits for the reply. The kernel
// is shut down after.
func pipelinedKernelInfo(t *testing.T, base, token, spec string, wait time.Duration) error {
	t.Helper()
	id := restKernel(t, http.MethodPost, base+"api/kernels", token, fmt.Sprintf(`{"name":%q}`, spec))
	defer restKernel(t, http.MethodDelete, base+"api/kernels/"+id, token, "")

	msgID := uuid.NewString()
	msg := fmt.Sprintf(`{"header":{"msg_id":%q,"msg_type":"kernel_info_request","username":"t","session":%q,"date":"2026-01-02T03:04:05.000000Z","version":"5.3"},"parent_header":{},"metadata":{},"content":{},"channel":"shell"}`, msgID, uuid.NewString())
	d := websocket.Dialer{NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &pipelining{Conn: c, frame: clientFrame([]byte(msg))}, nil
	}}
	u := "ws" + strings.TrimPrefix(base, "http") + "api/kernels/" + id + "/channels"
	conn, _, err := d.Dial(u, http.Header{"Authorization": {"token " + token}})
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(wait))
	for {
		_, data, err := conn.ReadMessage()
		if err != nil {
			return fmt.Errorf("no kernel_info_reply to the first message: %w", err)
		}
		var m struct {
			Header struct {
				MsgType string `json:"msg_type"`
			} `json:"header"`
			Parent struct {
				MsgID string `json:"msg_id"`
			} `json:"parent_header"`
		}
		if json.Unmarshal(data, &m) == nil && m.Parent.MsgID == msgID && m.Header.MsgType == "kernel_info_reply" {
			return nil
		}
	}
}

// restKernel calls the kernels API and returns the id of the kernel in
// the answer, if any.
func restKernel(t *testing.T, method, url, token, body string) string {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "token "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, b)
	}
	var k struct {
		ID string `json:"id"`
	}
	json.Unmarshal(b, &k)
	return k.ID
}

// pipelining is a connection that sends frame in the same write as the
// end of the HTTP handshake, as a client whose message arrives with its
// handshake does.
type pipelining struct {
	net.Conn
	frame   []byte
	pending []byte
}

func (p *pipelining) Write(b []byte) (int, error) {
	if p.frame == nil {
		return p.Conn.Write(b)
	}
	p.pending = append(p.pending, b...)
	if !bytes.HasSuffix(p.pending, []byte("\r\n\r\n")) {
		return len(b), nil
	}
	out := append(p.pending, p.frame...)
	p.frame, p.pending = nil, nil
	if _, err := p.Conn.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}

// clientFrame is a masked websocket text frame of payload.
func clientFrame(payload []byte) []byte {
	f := []byte{0x81}
	switch n := len(payload); {
	case n < 126:
		f = append(f, 0x80|byte(n))
	case n < 1<<16:
		f = append(f, 0x80|126)
		f = binary.BigEndian.AppendUint16(f, uint16(n))
	default:
		f = append(f, 0x80|127)
		f = binary.BigEndian.AppendUint64(f, uint64(n))
	}
	var mask [4]byte
	rand.Read(mask[:])
	f = append(f, mask[:]...)
	for i, c := range payload {
		f = append(f, c^mask[i%4])
	}
	return f
}

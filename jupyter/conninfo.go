package jupyter

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"
)

// ConnInfo is a kernel's connection file.
type ConnInfo struct {
	ShellPort       int    `json:"shell_port"`
	IOPubPort       int    `json:"iopub_port"`
	StdinPort       int    `json:"stdin_port"`
	ControlPort     int    `json:"control_port"`
	HBPort          int    `json:"hb_port"`
	IP              string `json:"ip"`
	Key             string `json:"key"`
	Transport       string `json:"transport"`
	SignatureScheme string `json:"signature_scheme"`
	KernelName      string `json:"kernel_name"`
}

// Port returns the port (or, for ipc, the suffix) of channel c.
func (ci *ConnInfo) Port(c Channel) int {
	switch c {
	case Shell:
		return ci.ShellPort
	case Control:
		return ci.ControlPort
	case Stdin:
		return ci.StdinPort
	case IOPub:
		return ci.IOPubPort
	case Heartbeat:
		return ci.HBPort
	}
	return 0
}

// Endpoint returns the ZeroMQ endpoint of channel c: tcp://ip:port, or
// ipc://ip-N for the ipc transport, as jupyter_client names them.
func (ci *ConnInfo) Endpoint(c Channel) string {
	if ci.Transport == "ipc" {
		return "ipc://" + ci.IP + "-" + strconv.Itoa(ci.Port(c))
	}
	return "tcp://" + net.JoinHostPort(ci.IP, strconv.Itoa(ci.Port(c)))
}

// WriteFile writes the connection file readable by its owner only.
func (ci *ConnInfo) WriteFile(path string) error {
	b, err := json.MarshalIndent(ci, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// NewKey returns a random 256-bit HMAC key, hex-encoded.
func NewKey() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// NewConnInfo returns connection info with a fresh key. For tcp it picks
// five free ports on ip; for ipc, ip is the path prefix of the sockets and
// the ports are 1 to 5.
func NewConnInfo(transport, ip, kernelName string) (ConnInfo, error) {
	ci := ConnInfo{IP: ip, Key: NewKey(), Transport: transport, SignatureScheme: "hmac-sha256", KernelName: kernelName}
	var ports [5]int
	switch transport {
	case "ipc":
		ports = [5]int{1, 2, 3, 4, 5}
	case "tcp":
		var err error
		if ports, err = freePorts(ip); err != nil {
			return ConnInfo{}, err
		}
	default:
		return ConnInfo{}, fmt.Errorf("jupyter: unknown transport %q", transport)
	}
	ci.ShellPort, ci.IOPubPort, ci.StdinPort, ci.ControlPort, ci.HBPort = ports[0], ports[1], ports[2], ports[3], ports[4]
	return ci, nil
}

// handedOut remembers ports given to kernels that may not have bound them
// yet, so that two kernels starting at once never get the same port.
var handedOut = struct {
	sync.Mutex
	at map[int]time.Time
}{at: map[int]time.Time{}}

// portHold is how long a handed-out port is kept from other kernels.
const portHold = time.Minute

// freePorts asks the system for five distinct free ports on ip.
func freePorts(ip string) ([5]int, error) {
	var ports [5]int
	var open []net.Listener
	defer func() {
		for _, l := range open {
			l.Close()
		}
	}()
	handedOut.Lock()
	defer handedOut.Unlock()
	now := time.Now()
	for p, t := range handedOut.at {
		if now.Sub(t) > portHold {
			delete(handedOut.at, p)
		}
	}
	for n := 0; n < len(ports); {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			return ports, fmt.Errorf("jupyter: picking a port: %w", err)
		}
		open = append(open, l)
		p := l.Addr().(*net.TCPAddr).Port
		if _, taken := handedOut.at[p]; taken {
			continue
		}
		handedOut.at[p] = now
		ports[n] = p
		n++
	}
	return ports, nil
}

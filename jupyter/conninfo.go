package jupyter

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"os"
	"strconv"
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

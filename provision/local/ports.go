package local

import (
	"fmt"
	"net"
	"sync"
	"time"

	"kernelgate/jupyter"
)

// newConnInfo returns connection info with a fresh key. For tcp it picks
// five free ports on ip; for ipc, ip is the path prefix of the sockets and
// the ports are 1 to 5.
func newConnInfo(transport, ip, kernelName string) (jupyter.ConnInfo, error) {
	ci := jupyter.ConnInfo{IP: ip, Key: jupyter.NewKey(), Transport: transport, SignatureScheme: "hmac-sha256", KernelName: kernelName}
	var ports [5]int
	switch transport {
	case "ipc":
		ports = [5]int{1, 2, 3, 4, 5}
	case "tcp":
		var err error
		if ports, err = freePorts(ip); err != nil {
			return jupyter.ConnInfo{}, err
		}
	default:
		return jupyter.ConnInfo{}, fmt.Errorf("jupyter: unknown transport %q", transport)
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

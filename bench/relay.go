//go:build linux

package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// The relay is the floor of a plain Go process (net package reads and
// writes) between a client and a kernel: a second process that copies
// bytes both ways and does nothing else. The direct client through it
// (the "floor" rows) pays what a process hop costs on this machine (two
// more loopback writes, and two more wake-ups of a process that sleeps
// between messages); what kernelgate adds beyond that is its own work.

// relayMain runs `bench -relay PORT,PORT,...`: it listens on a free port
// for each target port, prints those ports on one line, relays every
// connection to its target, and exits when stdin closes.
func relayMain(targets string) error {
	var ports []string
	for _, t := range strings.Split(targets, ",") {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		go relayAccept(l, "127.0.0.1:"+t)
		ports = append(ports, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	fmt.Println(strings.Join(ports, ","))
	io.Copy(io.Discard, os.Stdin)
	return nil
}

func relayAccept(l net.Listener, target string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go relayConn(c, target)
	}
}

// relayConn connects c to target (retrying while the kernel has not yet
// bound its port, as a ZeroMQ client would) and copies both ways.
func relayConn(c net.Conn, target string) {
	var k net.Conn
	var err error
	for deadline := time.Now().Add(time.Minute); ; {
		if k, err = net.Dial("tcp", target); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // dial retry interval
	}
	if err != nil {
		c.Close()
		return
	}
	go func() {
		io.Copy(k, c)
		k.Close()
	}()
	io.Copy(c, k)
	c.Close()
}

// startRelay runs this program as a relay in front of a kernel's shell,
// iopub and control ports, as a directclient.Relay that also returns the
// relay's process id.
func startRelay(kernel [5]int) (dial [5]int, stop func(), pid int, err error) {
	exe, err := os.Executable()
	if err != nil {
		return dial, nil, 0, err
	}
	idx := []int{0, 1, 3} // shell, iopub, control
	var targets []string
	for _, i := range idx {
		targets = append(targets, strconv.Itoa(kernel[i]))
	}
	cmd := exec.Command(exe, "-relay", strings.Join(targets, ","))
	in, err := cmd.StdinPipe()
	if err != nil {
		return dial, nil, 0, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return dial, nil, 0, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return dial, nil, 0, err
	}
	stop = func() {
		in.Close()
		cmd.Wait()
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	ports := strings.Split(strings.TrimSpace(line), ",")
	if err != nil || len(ports) != len(idx) {
		stop()
		return dial, nil, 0, errors.Join(errors.New("the relay did not say its ports"), err)
	}
	dial = kernel
	for j, i := range idx {
		if dial[i], err = strconv.Atoi(ports[j]); err != nil {
			stop()
			return dial, nil, 0, err
		}
	}
	return dial, stop, cmd.Process.Pid, nil
}

//go:build linux

package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
)

// bareServeMain runs `bench -serve-file PATH`: a bare net/http server on
// a free loopback port that answers every GET with the file (http.ServeFile:
// sendfile from the page cache, as the gateway's downloads), prints its URL
// on one line and exits when stdin closes. It is the download row's floor:
// the same client, the same loopback TCP, no gateway.
func bareServeMain(path string) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFile(w, r, path)
	})}
	go srv.Serve(l)
	fmt.Println("http://" + l.Addr().String() + "/")
	io.Copy(io.Discard, os.Stdin)
	return srv.Close()
}

// startBareServer starts `bench -serve-file path` and returns the server
// to download from (its URL; no token) and how to stop it.
func startBareServer(path string) (*server, func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(exe, "-serve-file", path)
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	stop := func() {
		in.Close()
		cmd.Wait()
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "http://") {
		stop()
		return nil, nil, errors.Join(errors.New("the bare file server did not say its URL"), err)
	}
	return &server{name: "bare file server", url: strings.TrimSpace(line)}, stop, nil
}

package kubernetes

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"kernelgate/jupyter"
)

// Entry is `kernelgate kernel-entry -- ARGV...`, the launcher of a kernel
// pod: it writes the connection file from its environment (the pod IP,
// the fixed ports, the key from the kernel's Secret), puts its path in
// place of {connection_file} in ARGV and execs ARGV without the key in
// the environment.
func Entry(args []string) error {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		return fmt.Errorf("usage: kernelgate kernel-entry -- KERNEL-ARGV... (with {connection_file})")
	}
	ip, key := os.Getenv(EnvIP), os.Getenv(EnvKey)
	if ip == "" || key == "" {
		return fmt.Errorf("kernel-entry: %s and %s must be set", EnvIP, EnvKey)
	}
	ports := strings.Split(os.Getenv(EnvPorts), ",")
	if len(ports) != 5 {
		return fmt.Errorf("kernel-entry: %s must list 5 ports", EnvPorts)
	}
	var p [5]int
	for i, s := range ports {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 || n > 65535 {
			return fmt.Errorf("kernel-entry: bad port %q", s)
		}
		p[i] = n
	}
	ci := jupyter.ConnInfo{ShellPort: p[0], IOPubPort: p[1], StdinPort: p[2], ControlPort: p[3], HBPort: p[4],
		IP: ip, Key: key, Transport: "tcp", SignatureScheme: os.Getenv(EnvScheme), KernelName: os.Getenv(EnvName)}
	if ci.SignatureScheme == "" {
		ci.SignatureScheme = "hmac-sha256"
	}
	dir, err := os.MkdirTemp("", "kernel-")
	if err != nil {
		return fmt.Errorf("kernel-entry: %w", err)
	}
	file := filepath.Join(dir, "connection.json")
	if err := ci.WriteFile(file); err != nil {
		return fmt.Errorf("kernel-entry: %w", err)
	}
	argv := make([]string, len(args))
	for i, a := range args {
		argv[i] = strings.ReplaceAll(a, "{connection_file}", file)
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return fmt.Errorf("kernel-entry: %w", err)
	}
	env := make([]string, 0, len(os.Environ()))
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, EnvKey+"=") {
			env = append(env, kv)
		}
	}
	return syscall.Exec(path, argv, env)
}

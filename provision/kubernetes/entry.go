package kubernetes

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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
	ci := connInfo(ip, key, os.Getenv(EnvName))
	ci.ShellPort, ci.IOPubPort, ci.StdinPort, ci.ControlPort, ci.HBPort = p[0], p[1], p[2], p[3], p[4]
	if s := os.Getenv(EnvScheme); s != "" {
		ci.SignatureScheme = s
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

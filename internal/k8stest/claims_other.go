//go:build !linux

package k8stest

import (
	"errors"
	"syscall"
)

var errNoMountNamespace = errors.New("the test node mounts claims on Linux only")

func mountNamespace(*syscall.SysProcAttr) error { return errNoMountNamespace }

func inMountNamespace(int, string, []string) ([]string, error) { return nil, errNoMountNamespace }

//go:build tools

// Package controlplane pins the commands scripts/k8s-binaries.sh builds; it
// holds no code of its own.
package controlplane

import (
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)

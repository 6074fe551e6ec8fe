// Package local is kernelgate's local-provisioner: it runs kernels as
// processes of this host and implements jupyter.Provisioner for them.
//
// It owns the launch of a kernel process (local.go, kernelenv.go, the
// gate of gate_unix.go), Python kernels forked from a zygote (zygote.go,
// zygote.py), cgroups and rlimits (cgroup.go, limits.go), the bubblewrap
// sandbox (sandbox*.go), detached kernels adopted again by a later
// gateway (localinfo.go, adopted.go, orphan.go, sweep.go) and commands
// started beside a kernel, also once adopted (command.go, commandinfo.go).
//
// What it keeps of a kernel to find it again is its Info, the opaque Data
// of the kernel's jupyter.ProvisionerInfo. Its configuration is the
// Provisioner's fields, which a launch may override with Options.
package local

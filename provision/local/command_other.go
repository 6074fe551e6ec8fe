//go:build !linux

package local

import "kernelgate/jupyter"

// planForked does nothing: kernels are forked from zygotes on Linux only.
func planForked(jupyter.Process, commandPlan) {}

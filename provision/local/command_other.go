//go:build !linux

package jupyter

// planForked does nothing: kernels are forked from zygotes on Linux only.
func planForked(Process, commandPlan) {}
